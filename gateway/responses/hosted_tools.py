"""A Responses request's server-side tools (`mcp`, `code_interpreter`, `web_search`) → the gateway's toolset
for the response: checked against the operator's allow-lists, MCP tool lists fetched (or cached), the
python sandbox's container chosen; and the approvals the request answers, resolved against the dialog."""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from typing import Any

from backends.base import Constraint
from harmony import Role

from ..errors import invalid
from ..generation.dialog import Approval, DialogItem, Entry
from ..generation.loop import PendingApproval
from ..hosted.mcp_servers import McpServer, McpToolInfo, McpUnavailable
from ..hosted.runtime import HostedRuntime
from ..hosted.toolset import McpBinding, Toolset, check_mcp_url, mcp_binding_problem
from ..ids import new_id
from .models.items import CodeInterpreterCallInput, McpListToolsInput
from .models.request import ResponsesRequest
from .models.tools import (
    WEB_SEARCH_KINDS,
    CodeInterpreterTool,
    HostedTool,
    McpTool,
    McpToolFilter,
    NamedHosted,
    NamedMcp,
    NamespaceTool,
)

BROWSER_CALLS = ("browser.search", "browser.open", "browser.find")
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _listed_labels(req: ResponsesRequest, previous_output: list[dict[str, Any]]) -> set[str]:
    """Servers whose tool list the client already holds: in its input or the previous response's output."""
    labels = {item.get("server_label") for item in previous_output if item.get("type") == "mcp_list_tools"}
    if not isinstance(req.input, str):
        labels |= {item.server_label for item in req.input if isinstance(item, McpListToolsInput)}
    return {label for label in labels if isinstance(label, str)}


def _previous_container(req: ResponsesRequest, previous_output: list[dict[str, Any]]) -> str | None:
    """The sandbox the response chain has used so far, so that its state carries on."""
    ids = [item.get("container_id") for item in previous_output if item.get("type") == "code_interpreter_call"]
    if not isinstance(req.input, str):
        ids += [item.container_id for item in req.input if isinstance(item, CodeInterpreterCallInput)]
    found = [value for value in ids if isinstance(value, str) and value]
    return found[-1] if found else None


def _filtered(tools: list[McpToolInfo], allowed: list[str] | McpToolFilter | None) -> list[McpToolInfo]:
    if allowed is None:
        return tools
    if isinstance(allowed, list):
        return [tool for tool in tools if tool.name in allowed]
    kept = tools
    if allowed.tool_names is not None:
        kept = [tool for tool in kept if tool.name in allowed.tool_names]
    if allowed.read_only:
        kept = [tool for tool in kept if (tool.annotations or {}).get("readOnlyHint")]
    return kept


def _approval_sets(tool: McpTool) -> tuple[frozenset[str] | None, frozenset[str]]:
    """(tools that need approval, None for all; tools that never do). OpenAI's default is to ask."""
    policy = tool.require_approval
    if policy is None or policy == "always":
        return None, frozenset()
    if policy == "never":
        return frozenset(), frozenset()
    always = frozenset(policy.always.tool_names or []) if policy.always else frozenset()
    never = frozenset(policy.never.tool_names or []) if policy.never else frozenset()
    if policy.always is None:  # only `never` given: the rest still ask
        return None, never
    return always, never


async def _bind_mcp(runtime: HostedRuntime, tenant: str, tool: McpTool, param: str, listed: bool) -> McpBinding:
    assert tool.server_url is not None
    check_mcp_url(tool.server_url, runtime.settings.mcp.allowed_urls.for_tenant(tenant), f"{param}.server_url")
    if importlib.util.find_spec("mcp") is None:
        raise invalid(f"{param}.type", "MCP tools need the gateway installed with its mcp extra.")
    headers = dict(tool.headers or {})
    if tool.authorization:
        headers["Authorization"] = f"Bearer {tool.authorization}"
    server = McpServer(tool.server_label, tool.server_url, headers)
    try:
        tools = await runtime.mcp.list_tools(tenant, server)
    except McpUnavailable as exc:
        raise mcp_binding_problem(exc, f"{param}.server_url") from exc
    always, never = _approval_sets(tool)
    return McpBinding(server, _filtered(tools, tool.allowed_tools), always, never, listed)


async def hosted_toolset(
    runtime: HostedRuntime, tenant: str, req: ResponsesRequest, previous_output: list[dict[str, Any]]
) -> tuple[Toolset | None, list[str]]:
    """The toolset (None when the request has no server-side tool the gateway runs) and the hosted tool
    types it does not run here (not offered to the model; reported)."""
    if not any(isinstance(tool, McpTool | CodeInterpreterTool | HostedTool) for tool in req.tools):
        return None, []
    toolset = Toolset(tenant, runtime, deadline=time.monotonic() + runtime.settings.max_seconds)
    not_offered: list[str] = []
    listed = _listed_labels(req, previous_output)
    client_namespaces = {tool.name for tool in req.tools if isinstance(tool, NamespaceTool)}
    for index, tool in enumerate(req.tools):
        param = f"tools[{index}]"
        if isinstance(tool, McpTool):
            label = tool.server_label
            if label in toolset.mcp or label in client_namespaces:
                raise invalid(f"{param}.server_label", f"server_label '{label}' is used twice.")
            toolset.mcp[label] = await _bind_mcp(runtime, tenant, tool, param, label in listed)
        elif isinstance(tool, CodeInterpreterTool):
            if not runtime.python_enabled:
                not_offered.append(tool.type)
            elif toolset.container_id is None:
                chosen = (
                    tool.container if isinstance(tool.container, str) else _previous_container(req, previous_output)
                )
                toolset.container_id = chosen or new_id("cntr_")
        elif isinstance(tool, HostedTool) and tool.type in WEB_SEARCH_KINDS:
            if toolset.browser is None:
                toolset.browser = runtime.browser()
            if toolset.browser is None:
                not_offered.append(tool.type)
    offered = toolset.mcp or toolset.browser is not None or toolset.container_id is not None
    return (toolset if offered else None), not_offered


def pending_approvals(items: list[DialogItem], dialog: list[Entry], toolset: Toolset | None) -> list[PendingApproval]:
    """The calls this request approves or declines, each found in the dialog unanswered; a 400 otherwise."""
    pending = []
    for approval in (item for item in items if isinstance(item, Approval)):
        param = f"{approval.param}.approval_request_id"
        index = next((i for i, entry in enumerate(dialog) if entry.call_id == approval.request_id), None)
        if index is None:
            raise invalid(param, f"No approval request with id '{approval.request_id}' in this conversation.")
        message = dialog[index].message
        label, _, name = (message.recipient or "").partition(".")
        if toolset is None or label not in toolset.mcp:
            raise invalid(param, f"The request's tools have no MCP server '{label}' to run the approved call on.")
        if any(entry.message.role is Role.TOOL for entry in dialog[index + 1 :]):
            raise invalid(param, f"Approval request '{approval.request_id}' was already answered.")
        pending.append(
            PendingApproval(
                approval.request_id,
                label,
                name,
                message.text,
                message.channel or "commentary",
                approval.approve,
                approval.reason,
            )
        )
    return pending


def with_hosted_tools(req: ResponsesRequest, constraint: Constraint, toolset: Toolset | None) -> Constraint:
    """The constraint over every tool the model is offered: the server-side ones added (MCP tools as
    `label.name` with their input schemas, python and the browser as built-in calls), and a `tool_choice` that
    names one of them, or `required` with some of them, applied (a 400 when what it names is not offered)."""
    mcp: dict[str, dict[str, Any] | None] = {}
    builtin: dict[str, tuple[str, dict[str, Any] | None]] = {}
    if toolset is not None:
        for label, binding in toolset.mcp.items():
            mcp.update({f"{label}.{tool.name}": tool.input_schema or None for tool in binding.tools})
        if toolset.container_id is not None:
            builtin["python"] = ("analysis to=python code", None)
        if toolset.browser is not None:
            builtin.update({name: (f"analysis to={name} code", ANY_OBJECT) for name in BROWSER_CALLS})
    choice = req.tool_choice
    names: tuple[str, ...] | None = None
    if isinstance(choice, NamedMcp):
        binding = toolset.mcp.get(choice.server_label) if toolset is not None else None
        if binding is None:
            raise invalid(
                "tool_choice.server_label",
                f"tool_choice names MCP server '{choice.server_label}', which is not in tools.",
            )
        names = tuple(
            f"{choice.server_label}.{tool.name}" for tool in binding.tools if choice.name in (None, tool.name)
        )
        if not names:
            raise invalid("tool_choice.name", f"MCP server '{choice.server_label}' offers no tool '{choice.name}'.")
    elif isinstance(choice, NamedHosted):
        wanted = ("python",) if choice.type == "code_interpreter" else BROWSER_CALLS
        if wanted[0] not in builtin:
            raise invalid("tool_choice", f"tool_choice names {choice.type}, which is not in tools or not offered here.")
        names = wanted
    elif choice == "required" and (mcp or builtin or constraint.tools == "required"):
        names = (*(constraint.tool_names if constraint.tools == "required" else ()), *mcp, *builtin)
    elif choice == "required":
        raise invalid("tool_choice", "tool_choice 'required' needs at least one tool this gateway offers in tools.")
    if names is None and not mcp and not builtin and not constraint.builtin_calls:
        return constraint  # nothing server-side to add (most requests): the replace below would copy it as it is
    return dataclasses.replace(
        constraint,
        tools="required" if names else constraint.tools,
        tool_names=names or constraint.tool_names,
        tool_parameters={**constraint.tool_parameters, **mcp},
        builtin_calls=builtin,
    )
