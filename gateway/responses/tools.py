"""A Responses request's `tools` → what the model is offered: the `functions` namespace (function and
custom tools), the client's own namespaces, and the hosted tools left out because nothing here runs them
(the tools the gateway runs itself are gateway/responses/hosted_tools.py's)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import llguidance

from harmony import ToolDescription, ToolNamespace

from ..errors import invalid
from ..generation.assembler import CallRouting
from .models.request import ResponsesRequest
from .models.tools import WEB_SEARCH_KINDS, CustomTool, FunctionTool, HostedTool, NamespaceTool

FUNCTIONS = "functions"
MAX_OFFERED = 512  # callable tools in all, namespaces' members included


@functools.lru_cache(maxsize=256)
def _grammar_problem(syntax: str, definition: str) -> str:
    """Why llguidance (the engine's grammar engine) cannot compile the grammar; "" when it can. Cached: a
    client such as Codex sends the same grammar with every request."""
    if syntax == "lark":
        return llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(definition))
    return llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_regex(definition))


@dataclass(slots=True)
class OfferedTools:
    functions: list[ToolDescription] = field(default_factory=list)
    namespaces: list[ToolNamespace] = field(default_factory=list)
    parameters: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # by qualified name
    grammars: dict[str, tuple[str, str]] = field(default_factory=dict)  # custom tools: (syntax, definition)
    schemas: list[tuple[str, dict[str, Any] | None, str | None]] = field(default_factory=list)  # (param, ...)
    not_offered: list[str] = field(default_factory=list)  # hosted tool types, in request order
    routing: CallRouting = field(default_factory=CallRouting)


def _freeform_text(tool: CustomTool) -> str:
    syntax, definition = tool.format.grammar
    return f"The input must match this {syntax} grammar:\n{definition}" if syntax else ""


def _describe(tool: FunctionTool | CustomTool) -> ToolDescription:
    if isinstance(tool, CustomTool):
        return ToolDescription(tool.name, tool.description or "", None, None, _freeform_text(tool))
    return ToolDescription(tool.name, tool.description or "", tool.parameters, tool.parameters_json)


class _Collector:
    def __init__(self) -> None:
        self.offered = OfferedTools()
        self._freeform: set[str] = set()

    def add(self, tool: FunctionTool | CustomTool, namespace: str, param: str) -> ToolDescription:
        qualified = tool.name if namespace == FUNCTIONS else f"{namespace}.{tool.name}"
        offered = self.offered
        if qualified in offered.parameters or qualified in offered.grammars:
            raise invalid(f"{param}.name", f"Tool name '{qualified}' is given twice.")
        if len(offered.parameters) + len(offered.grammars) >= MAX_OFFERED:
            raise invalid("tools", f"At most {MAX_OFFERED} tools can be offered, namespaces' tools included.")
        if isinstance(tool, CustomTool):
            syntax, definition = tool.format.grammar
            if syntax and (problem := _grammar_problem(syntax, definition)):
                raise invalid(f"{param}.format.definition", f"The {syntax} grammar does not compile: {problem}")
            offered.grammars[qualified] = (syntax, definition)
            self._freeform.add(f"{namespace}.{tool.name}")
        else:
            offered.parameters[qualified] = tool.parameters
            offered.schemas.append((f"{param}.parameters", tool.parameters, tool.parameters_json))
        return _describe(tool)

    def routing(self) -> CallRouting:
        names = frozenset(namespace.name for namespace in self.offered.namespaces)
        return CallRouting(names, frozenset(self._freeform))


def offered_tools(request: ResponsesRequest) -> OfferedTools:
    """The tools as the model sees them; duplicate names are a 400 naming the second one."""
    collector = _Collector()
    offered = collector.offered
    for index, tool in enumerate(request.tools):
        param = f"tools[{index}]"
        if isinstance(tool, HostedTool):
            if tool.type not in WEB_SEARCH_KINDS:  # web search: the hosted toolset decides
                offered.not_offered.append(tool.type)
        elif isinstance(tool, NamespaceTool):
            if any(namespace.name == tool.name for namespace in offered.namespaces):
                raise invalid(f"{param}.name", f"Namespace '{tool.name}' is given twice.")
            members = [collector.add(member, tool.name, f"{param}.tools[{i}]") for i, member in enumerate(tool.tools)]
            offered.namespaces.append(ToolNamespace(tool.name, tool.description, members))
        elif isinstance(tool, FunctionTool | CustomTool):
            offered.functions.append(collector.add(tool, FUNCTIONS, param))
    offered.routing = collector.routing()
    return offered
