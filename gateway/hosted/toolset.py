"""A request's server-side tools: what the model is offered (browser and python in the system message, each
MCP server as a namespace), how its calls are routed, and running them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from harmony import ToolDescription, ToolNamespace, browser_namespace, python_namespace

from ..errors import ApiError, invalid
from ..observability.tracing import child_span
from .browser import BrowserSession
from .mcp_servers import McpServer, McpToolInfo, McpUnavailable
from .results import HostedKind, McpResult, PythonResult, SearchResult, ToolRun
from .runtime import HostedRuntime
from .sandbox import SandboxUnavailable

BROWSER = "browser"
PYTHON = "python"


@dataclass(slots=True)
class McpBinding:
    server: McpServer
    tools: list[McpToolInfo]
    always_approve: frozenset[str] | None  # tools needing approval; None: every tool
    never_approve: frozenset[str]
    listed: bool  # the client already holds this server's tool list (no mcp_list_tools item again)

    def needs_approval(self, name: str) -> bool:
        if name in self.never_approve:
            return False
        return self.always_approve is None or name in self.always_approve


@dataclass(slots=True)
class Toolset:
    tenant: str
    runtime: HostedRuntime
    browser: BrowserSession | None = None
    container_id: str | None = None  # the python sandbox, when offered
    mcp: dict[str, McpBinding] = field(default_factory=dict)
    deadline: float = 0.0  # monotonic time by which the tool calls of this response must be done

    @property
    def kinds(self) -> dict[str, HostedKind]:
        """The recipients' namespaces (or bare names) the gateway answers, and their item kinds."""
        kinds: dict[str, HostedKind] = {label: "mcp_call" for label in self.mcp}
        if self.browser is not None:
            kinds[BROWSER] = "web_search_call"
        if self.container_id is not None:
            kinds[PYTHON] = "code_interpreter_call"
        return kinds

    @property
    def builtin(self) -> list[ToolNamespace]:
        """For the system message, as the Harmony reference renders them."""
        namespaces = []
        if self.browser is not None:
            namespaces.append(browser_namespace())
        if self.container_id is not None:
            namespaces.append(python_namespace())
        return namespaces

    @property
    def namespaces(self) -> list[ToolNamespace]:
        """Each MCP server's tools as a developer-message namespace named by its label."""
        return [
            ToolNamespace(
                label,
                None,
                [ToolDescription(tool.name, tool.description, tool.input_schema) for tool in binding.tools],
            )
            for label, binding in self.mcp.items()
        ]

    @property
    def approvals(self) -> frozenset[str]:
        """The MCP tools (`label.name`) whose calls wait for the client's approval."""
        return frozenset(
            f"{label}.{tool.name}"
            for label, binding in self.mcp.items()
            for tool in binding.tools
            if binding.needs_approval(tool.name)
        )

    async def run(self, kind: HostedKind, namespace: str | None, name: str | None, text: str) -> ToolRun:
        """Run a settled call of the model (its item's kind, the recipient's namespace and name, its input), in a
        span of its own (its kind and name; never its input)."""
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.type": kind, "gen_ai.tool.name": name or ""}
        with child_span(f"execute_tool {kind}", attributes):
            return await self._run(kind, namespace, name, text)

    async def _run(self, kind: HostedKind, namespace: str | None, name: str | None, text: str) -> ToolRun:
        if kind == "web_search_call":
            assert self.browser is not None
            call = await self.browser.call(name or "", text)
            return ToolRun(call.text, SearchResult(call.action, call.failed))
        if kind == "code_interpreter_call":
            return await self._run_python(text)
        return await self.run_mcp(namespace or "", name or "", text)

    async def _run_python(self, code: str) -> ToolRun:
        assert self.container_id is not None
        try:
            cell = await self.runtime.sandboxes.run(self.tenant, self.container_id, code)
        except SandboxUnavailable as exc:
            return ToolRun(f"[python is unavailable: {exc}]", PythonResult(self.container_id, None, True))
        return ToolRun(cell.output or "[no output]", PythonResult(self.container_id, cell.output, cell.failed))

    async def run_mcp(self, label: str, name: str, arguments: str) -> ToolRun:
        binding = self.mcp[label]
        try:
            parsed = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            error = {"type": "mcp_protocol_error", "code": -32602, "message": "the arguments are not a JSON object"}
            return ToolRun("Error: the arguments are not a JSON object.", McpResult(None, error))
        if name not in {tool.name for tool in binding.tools}:
            error = {"type": "mcp_protocol_error", "code": -32602, "message": f"unknown tool '{name}'"}
            return ToolRun(f"Error: server '{label}' has no tool '{name}'.", McpResult(None, error))
        result = await self.runtime.mcp.call_tool(binding.server, name, parsed)
        answer = f"Error: {orjson.dumps(result.error).decode()}" if result.error is not None else result.output or ""
        return ToolRun(answer, McpResult(result.output, result.error))

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()


def mcp_binding_problem(exc: McpUnavailable, param: str) -> ApiError:
    """A tool list that cannot be had fails the request: 424 (Failed Dependency), naming the server."""
    return ApiError(424, str(exc), param=param, code="mcp_list_tools_failed")


def allowed(url: str, prefixes: list[str]) -> bool:
    """`url` is one of the prefixes or below one (a path boundary, so `https://a.example` does not let
    `https://a.example.evil` through)."""
    for prefix in prefixes:
        stem = prefix.rstrip("/")
        if url in (prefix, stem) or url.startswith(stem + "/") or url.startswith(stem + "?"):
            return True
    return False


def check_mcp_url(url: str, prefixes: list[str], param: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise invalid(param, "An MCP server_url must be an http or https URL.")
    if not allowed(url, prefixes):
        raise invalid(param, "This MCP server_url is not allowed for this API key; an operator can allow it.")
