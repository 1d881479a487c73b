"""What server-side tools share across requests in one replica: the sandboxes, the MCP client and its tool
lists, the page fetcher and the search provider."""

from __future__ import annotations

from .browser import BrowserSession
from .mcp_servers import McpClient
from .outbound import OutboundPolicy, PageFetcher
from .sandbox import SandboxPool
from .search import SearchProvider, search_provider
from .settings import HostedToolsSettings


class HostedRuntime:
    def __init__(self, settings: HostedToolsSettings) -> None:
        self.settings = settings
        self.policy = OutboundPolicy.from_settings(settings.outbound)
        self.sandboxes = SandboxPool(settings.python)
        self.mcp = McpClient(self.policy, settings.mcp)
        self.fetcher = PageFetcher(self.policy, settings.outbound)
        self.search: SearchProvider | None = search_provider(settings.web_search)

    async def start(self) -> None:
        """Learn what this host allows the sandbox before offering python."""
        if self.settings.python.enabled:
            await self.sandboxes.probe()

    @property
    def python_enabled(self) -> bool:
        """Enabled by the operator, and the start-up probe found the isolation it asks for (or was not run)."""
        return self.settings.python.enabled and self.sandboxes.unavailable is None

    def python_status(self) -> dict[str, object] | None:
        """For /readyz, when the operator enabled python: offered or why not, and what bounds its memory."""
        if not self.settings.python.enabled:
            return None
        pool = self.sandboxes
        status: dict[str, object] = {"offered": self.python_enabled}
        if pool.unavailable is not None:
            status["reason"] = pool.unavailable
        if pool.memory is not None:
            status["memory"] = pool.memory.as_log()
        return status

    def browser(self) -> BrowserSession | None:
        """A browser for one response, when a search provider is configured."""
        if self.search is None:
            return None
        return BrowserSession(self.search, self.fetcher, self.settings.web_search.max_results)

    async def aclose(self) -> None:
        await self.sandboxes.aclose()
        await self.fetcher.aclose()
        if self.search is not None:
            await self.search.aclose()
