"""Servers the server-side tool tests talk to: a real MCP server (the `mcp` SDK's own, over streamable
HTTP, run by uvicorn), a fake SearXNG speaking its JSON API, and a small web site; each on a free port."""

import threading
import time
import urllib.request
from typing import Any

import uvicorn
from aiohttp import web
from mcp.server.mcpserver import Context, MCPServer
from redis_servers import free_port
from threaded_server import ThreadedServer


class McpTestServer:
    """`add`, `echo_headers` (what the server received, to show the gateway forwards a client's token) and
    `fail` tools; `calls` records the arguments of every call."""

    def __init__(self, transport: str = "streamable-http") -> None:
        self.port = free_port()
        self.transport = transport
        self.calls: list[dict[str, Any]] = []
        self.headers_seen: list[str] = []
        server = MCPServer("test-tools")
        calls = self.calls
        headers_seen = self.headers_seen

        @server.tool(description="Add two integers.")
        def add(a: int, b: int) -> str:
            calls.append({"tool": "add", "a": a, "b": b})
            return str(a + b)

        @server.tool(description="Says whether the request carried the expected token.")
        def whoami(ctx: Context) -> str:
            request = ctx.request_context.request
            auth = request.headers.get("authorization", "") if request is not None else ""
            headers_seen.append(auth)
            calls.append({"tool": "whoami"})
            return "authorized" if auth == "Bearer secret-token-123" else "anonymous"

        @server.tool(description="Always fails.")
        def fail() -> str:
            raise ValueError("this tool always fails")

        app = server.sse_app() if transport == "sse" else server.streamable_http_app()
        self.listings = 0  # tools/list requests received

        async def counting(scope: Any, receive: Any, send: Any) -> None:
            async def counted() -> Any:
                message = await receive()
                if b'"tools/list"' in message.get("body", b""):
                    self.listings += 1
                return message

            await app(scope, counted, send)

        config = uvicorn.Config(counting, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{'sse' if self.transport == 'sse' else 'mcp'}"

    def start(self) -> "McpTestServer":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class WebFixtures:
    """A fake SearXNG (`/search?q=…&format=json`), a fake Brave Search API (`/res/v1/web/search`) and a
    small site (`/pages/…`) on one aiohttp server."""

    def __init__(self) -> None:
        self._server = ThreadedServer()
        self.port = self._server.port
        self.queries: list[str] = []

    @property
    def url(self) -> str:
        return self._server.url

    async def _search(self, request: web.Request) -> web.Response:
        if request.query.get("format") != "json":
            return web.Response(status=403, text="json format disabled")
        query = request.query.get("q", "")
        self.queries.append(query)
        results = [
            {"url": f"{self.url}/pages/tides", "title": "Tides explained", "content": "Why the sea rises twice a day."},
            {"url": f"{self.url}/pages/moon", "title": "The Moon", "content": "Earth's only natural satellite."},
        ]
        return web.json_response({"query": query, "results": results, "number_of_results": 2})

    async def _brave(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Subscription-Token") != "brave-key":
            return web.json_response({"error": "unauthorized"}, status=401)
        query = request.query.get("q", "")
        self.queries.append(query)
        count = int(request.query.get("count", "20"))
        results = [{"title": f"Result {i}", "url": f"{self.url}/pages/{i}", "description": "d"} for i in range(count)]
        return web.json_response({"type": "search", "web": {"type": "search", "results": results}})

    async def _page(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "big":
            return web.Response(
                text="<html><body>" + "<p>filler line</p>" * 200_000 + "</body></html>", content_type="text/html"
            )
        if name == "unclosed":  # quadratic for html.parser: 60 kB of it took 31 s
            return web.Response(text="<html><body>" + "<a " * 100_000, content_type="text/html")
        if name == "deep":  # nesting that end tags of other elements never close
            return web.Response(text="<html><body>" + "<span></b>" * 100_000, content_type="text/html")
        if name == "redirect":
            raise web.HTTPFound("http://169.254.169.254/latest/meta-data")
        body = (
            "<html><head><title>Tides explained</title><script>var x = 1;</script></head><body>"
            "<h1>Tides</h1><p>Tides are caused mainly by the gravity of the Moon.</p>"
            "<p>The Sun contributes about 46 percent of the tidal force.</p>"
            "<p>See <a href='/pages/moon'>the Moon page</a>.</p></body></html>"
        )
        return web.Response(text=body, content_type="text/html")

    def start(self) -> "WebFixtures":
        def make_app() -> web.Application:
            app = web.Application()
            app.router.add_get("/search", self._search)
            app.router.add_get("/res/v1/web/search", self._brave)
            app.router.add_get("/pages/{name}", self._page)
            return app

        self._server.serve(make_app)
        urllib.request.urlopen(f"{self.url}/pages/tides", timeout=5).read()
        return self

    def stop(self) -> None:
        self._server.close()


class HostileMcpServer:
    """An MCP server (streamable HTTP, JSON replies) whose replies are as large as it likes: at `/huge-list/mcp`
    its tool list, at `/huge-call/mcp` its tool's result, each `reply_bytes` of JSON; `/mcp` answers in
    proportion (one `dump` tool whose result is short)."""

    def __init__(self, reply_bytes: int) -> None:
        self._server = ThreadedServer()
        self.port = self._server.port
        self._filler = "x" * reply_bytes

    def url(self, kind: str = "") -> str:
        return f"{self._server.url}/{kind + '/' if kind else ''}mcp"

    async def _rpc(self, request: web.Request) -> web.Response:
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        kind = request.match_info.get("kind", "")
        method = message["method"]
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        elif method == "tools/list":
            description = self._filler if kind == "huge-list" else "Returns text."
            result = {"tools": [{"name": "dump", "description": description, "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            text = self._filler if kind == "huge-call" else "short"
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        else:
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "?"}})
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})

    async def _no_stream(self, request: web.Request) -> web.Response:
        return web.Response(status=405)

    def start(self) -> "HostileMcpServer":
        def make_app() -> web.Application:
            app = web.Application(client_max_size=1 << 20)
            for path in ("/mcp", "/{kind}/mcp"):
                app.router.add_post(path, self._rpc)
                app.router.add_get(path, self._no_stream)
                app.router.add_delete(path, self._no_stream)
            return app

        self._server.serve(make_app)
        return self

    def stop(self) -> None:
        self._server.close()
