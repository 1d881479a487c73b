"""Remote MCP servers, through the official `mcp` SDK over streamable HTTP (or SSE for a URL ending in
`/sse`): their tool lists (cached per tenant, server and credentials, for a TTL) and tool calls, each in a
session of its own, bounded in time and in what it returns. Connections go through the outbound policy."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from .outbound import OutboundPolicy, OutboundRefused
from .settings import McpSettings

log = structlog.get_logger("gateway.mcp")
for _chatty in ("httpx2", "mcp"):  # they log request URLs (which may carry tokens) at INFO
    logging.getLogger(_chatty).setLevel(logging.WARNING)
# the client logs a server's bad reply with a traceback; the gateway logs each failed listing or call itself
logging.getLogger("mcp.client").setLevel(logging.CRITICAL)

MAX_CACHED_LISTS = 1024


@dataclass(frozen=True, slots=True)
class McpServer:
    """One `mcp` tool of a request: where to connect and with which (secret) headers."""

    label: str
    url: str
    headers: dict[str, str]

    @property
    def credentials_key(self) -> str:
        """A digest of the headers: the cache tells credentials apart without holding them."""
        return hashlib.sha256(orjson.dumps(self.headers, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None


@dataclass(slots=True)
class McpResult:
    output: str | None
    error: dict[str, Any] | None  # the SDK's McpToolCallError shapes


class McpUnavailable(Exception):
    """Listing failed; the message is safe to show the client (no headers)."""


def _load_sdk() -> None:
    """The MCP SDK and its transports, imported once, and the CA bundle its sessions share, loaded once (each a
    fraction of a second of CPU: not on the event loop of a replica that serves requests)."""
    import mcp.client.sse
    import mcp.client.streamable_http  # noqa: F401

    from .mcp_transport import tls_context

    tls_context()


class McpClient:
    def __init__(self, policy: OutboundPolicy, settings: McpSettings) -> None:
        self._policy = policy
        self._settings = settings
        self._lists: dict[tuple[str, str, str], tuple[float, list[McpToolInfo]]] = {}
        if settings.allowed_urls.default or settings.allowed_urls.tenants:
            _load_sdk()  # at start-up, where MCP servers may be used

    @asynccontextmanager
    async def _session(self, server: McpServer) -> AsyncIterator[Any]:
        from mcp import ClientSession
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        from .mcp_transport import guarded_http_client

        timeout = self._settings.timeout_s
        if server.url.rstrip("/").endswith("/sse"):

            def factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
                # one stream carries the session's every reply: room for a few of the largest
                return guarded_http_client(
                    self._policy, dict(headers or {}), self._settings.timeout_s, 4 * self._max_bytes
                )

            transport = sse_client(server.url, headers=server.headers, timeout=timeout, httpx_client_factory=factory)
            async with transport as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                yield session
            return
        async with guarded_http_client(self._policy, server.headers, timeout, self._max_bytes) as http:
            transport = streamable_http_client(server.url, http_client=http, max_sse_event_size=self._max_bytes)
            async with transport as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                yield session

    @property
    def _max_bytes(self) -> int:
        """The most one reply may take: a result of max_output_chars in UTF-8 and JSON escapes, and room."""
        return self._settings.max_output_chars * 4 + 65536

    async def list_tools(self, tenant: str, server: McpServer) -> list[McpToolInfo]:
        key = (tenant, server.url, server.credentials_key)
        cached = self._lists.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        try:
            async with asyncio.timeout(self._settings.timeout_s), self._session(server) as session:
                listed = await session.list_tools()
        except Exception as exc:  # any transport or protocol failure: one clear message, no secrets
            refused = _refusal(exc)
            if refused is not None:
                raise McpUnavailable(f"MCP server '{server.label}': {refused}") from exc
            log.info("mcp_list_failed", server_label=server.label, error=type(exc).__name__)
            raise McpUnavailable(f"Error retrieving tool list from MCP server '{server.label}'") from exc
        tools = [
            McpToolInfo(
                tool.name,
                tool.description or "",
                dict(tool.input_schema or {"type": "object"}),
                tool.annotations.model_dump(exclude_none=True) if tool.annotations else None,
            )
            for tool in listed.tools
        ]
        if len(self._lists) >= MAX_CACHED_LISTS:
            self._lists.pop(next(iter(self._lists)))
        self._lists[key] = (time.monotonic() + self._settings.list_ttl_s, tools)
        return tools

    async def call_tool(self, server: McpServer, name: str, arguments: dict[str, Any]) -> McpResult:
        try:
            async with asyncio.timeout(self._settings.timeout_s), self._session(server) as session:
                result = await session.call_tool(name, arguments)
        except TimeoutError:
            return McpResult(None, {"type": "mcp_protocol_error", "code": -32001, "message": "the call timed out"})
        except Exception as exc:
            refused = _refusal(exc)
            if refused is not None:
                return McpResult(None, {"type": "http_error", "code": 403, "message": str(refused)})
            log.info("mcp_call_failed", server_label=server.label, error=type(exc).__name__)
            message = str((getattr(exc, "error", None) and exc.error.message) or type(exc).__name__)  # type: ignore[attr-defined]
            return McpResult(None, {"type": "mcp_protocol_error", "code": -32603, "message": message[:1000]})
        text = self._text(result)
        if result.is_error:
            return McpResult(None, {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]})
        return McpResult(text, None)

    def _text(self, result: Any) -> str:
        parts = []
        for block in result.content:
            if getattr(block, "type", None) == "text":
                parts.append(block.text)
            else:
                parts.append(f"[{getattr(block, 'type', 'content')} content omitted]")
        if not parts and result.structured_content is not None:
            parts.append(orjson.dumps(result.structured_content).decode())
        text = "\n".join(parts)
        limit = self._settings.max_output_chars
        return text if len(text) <= limit else text[:limit] + f"\n[output truncated at {limit} characters]"


def _refusal(exc: BaseException) -> OutboundRefused | None:
    """The outbound refusal behind a failure, however deep the SDK's task groups wrapped it."""
    if isinstance(exc, OutboundRefused):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _refusal(inner)
            if found is not None:
                return found
    cause = exc.__cause__ or exc.__context__
    return _refusal(cause) if cause is not None and cause is not exc else None
