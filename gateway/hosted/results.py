"""What running a server-side tool gave, typed: the answer the model reads next, and the result the API
reports on the call's item (the Responses JSON of it is written in responses/shape.py, not here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

HostedKind = Literal["web_search_call", "code_interpreter_call", "mcp_call", "mcp_list_tools", "mcp_approval_request"]


@dataclass(frozen=True, slots=True)
class SearchResult:
    action: dict[str, Any]  # what the browser did: search (query), open_page (url) or find_in_page
    failed: bool


@dataclass(frozen=True, slots=True)
class PythonResult:
    container_id: str
    logs: str | None  # what the cell printed; None when the sandbox could not run it
    failed: bool


@dataclass(frozen=True, slots=True)
class McpResult:
    output: str | None
    error: dict[str, Any] | None  # an MCP protocol or tool error, as the API reports it
    approval_request_id: str | None = None  # the approval request the client answered, when it needed one

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True, slots=True)
class McpListing:
    tools: list[dict[str, Any]] = field(default_factory=list)  # name, description, input_schema, annotations
    failed: bool = False


@dataclass(frozen=True, slots=True)
class NotRun:
    """The call was refused (its response's calls or tool time used up: incomplete) or ran out of time (failed)."""

    status: Literal["incomplete", "failed"]
    container_id: str | None = None  # the python sandbox's, for a code interpreter call

    @property
    def failed(self) -> bool:
        return self.status == "failed"


ToolResult = SearchResult | PythonResult | McpResult | McpListing | NotRun


@dataclass(frozen=True, slots=True)
class ToolRun:
    answer: str  # what the model reads as the tool's message
    result: ToolResult
