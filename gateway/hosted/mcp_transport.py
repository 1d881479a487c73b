"""The MCP SDK's HTTP client (httpx2) on the outbound policy: connections only to checked addresses, no
environment proxies, and no reply body past a bound (the SDK reads a JSON reply whole and parses it on the event
loop). Imported where MCP servers are allowed."""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpcore2
import httpx2

from .outbound import OutboundPolicy, OutboundRefused


class _GuardedNetwork(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend (under the MCP SDK's httpx2): connects to checked addresses only."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self._policy = policy
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        pairs = await self._policy.addresses(host, port)
        return await self._inner.connect_tcp(
            pairs[0][1], port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore2.AsyncNetworkStream:
        raise OutboundRefused("unix sockets are not reachable")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class ReplyTooLarge(httpx2.StreamError):
    """An MCP server's reply body ran past the bound (the SDK reports a stream error as the call's failure)."""


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._max_bytes:
                raise ReplyTooLarge(f"the MCP server's reply ran past {self._max_bytes} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedReplies(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, max_bytes: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        response.stream = _BoundedBody(response.stream, self._max_bytes)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The system's CA bundle, loaded once per process and shared by every MCP session (loading it takes 0.1-0.3
    s of CPU: per session, on the event loop, it stalled every other request)."""
    return httpx2.create_ssl_context(trust_env=False)


def guarded_http_client(
    policy: OutboundPolicy, headers: dict[str, str], timeout_s: float, max_reply_bytes: int
) -> httpx2.AsyncClient:
    """An httpx2 client for the MCP SDK: checked addresses, no environment proxies, the given timeout, reply
    bodies of at most `max_reply_bytes`."""
    context = tls_context()
    transport = httpx2.AsyncHTTPTransport(verify=context, trust_env=False)
    transport._pool = httpcore2.AsyncConnectionPool(  # the same pool, on the guarded network backend
        ssl_context=context, network_backend=_GuardedNetwork(policy)
    )
    bounded = _BoundedReplies(transport, max_reply_bytes)
    return httpx2.AsyncClient(transport=bounded, headers=headers, timeout=httpx2.Timeout(timeout_s), trust_env=False)
