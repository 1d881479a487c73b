"""The MCP SDK's HTTP client (httpx2) on the outbound policy: connections only to checked addresses, no
environment proxies. Imported when an MCP server is first used."""

from __future__ import annotations

from collections.abc import Iterable
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


def guarded_http_client(policy: OutboundPolicy, headers: dict[str, str], timeout_s: float) -> httpx2.AsyncClient:
    """An httpx2 client for the MCP SDK: checked addresses, no environment proxies, the given timeout."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore2.AsyncConnectionPool(  # the same pool, on the guarded network backend
        ssl_context=httpx2.create_ssl_context(trust_env=False), network_backend=_GuardedNetwork(policy)
    )
    return httpx2.AsyncClient(transport=transport, headers=headers, timeout=httpx2.Timeout(timeout_s), trust_env=False)
