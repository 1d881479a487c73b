"""Request options both APIs share: tool choice and output format → constraint and response format; effort."""

from __future__ import annotations

from typing import Any, Literal

from backends.base import Constraint
from harmony import ReasoningEffort, ResponseFormat

from ..errors import invalid
from ..intake.json_schemas import validator_for

JSON_OBJECT_FORMAT = ResponseFormat("json_object", {"type": "object"}, "Answer with one JSON object.")

Choice = Literal["auto", "none", "required"]


def tool_constraint(names: tuple[str, ...], choice: Choice | None, named: str | None) -> tuple[str, tuple[str, ...]]:
    """(Constraint.tools, allowed names) for a tool choice; a named function must be among the tools."""
    if named is not None:
        if named not in names:
            raise invalid("tool_choice", f"tool_choice names function '{named}', which is not in tools.")
        return "required", (named,)
    if choice == "required":
        if not names:
            raise invalid("tool_choice", "tool_choice 'required' needs at least one tool in tools.")
        return "required", names
    return ("none" if choice == "none" and names else "any"), ()


def output_format(
    kind: str | None, name: str | None, schema: dict[str, Any] | None, description: str | None, schema_param: str
) -> tuple[ResponseFormat | None, dict[str, Any] | None]:
    """The developer message's response format and the JSON Schema the final answer must match."""
    if kind == "json_schema":
        assert name is not None and schema is not None
        validator_for(schema, schema_param)
        return ResponseFormat(name, schema, description), schema
    if kind == "json_object":
        return JSON_OBJECT_FORMAT, {"type": "object"}
    return None, None


def constraint(
    parameters: dict[str, dict[str, Any] | None],
    choice: Choice | None,
    named: str | None,
    schema: dict[str, Any] | None,
    tool_schemas: list[tuple[str, dict[str, Any] | None, str | None]],
    grammars: dict[str, tuple[str, str]] | None = None,
) -> Constraint:
    """`parameters`: each function tool's name → its parameters schema; `tool_schemas`: each tool's
    (parameter name, schema, schema_text) in request order, each checked; `grammars`: each freeform tool's
    (syntax, definition), "" for free text."""
    for param, tool_schema, text in tool_schemas:  # in request order, duplicates included
        if tool_schema:
            validator_for(tool_schema, param, text)
    grammars = grammars or {}
    tools, allowed = tool_constraint((*parameters, *grammars), choice, named)
    return Constraint(tools, allowed, schema, parameters, grammars)  # type: ignore[arg-type]


# every effort and service tier the openai SDK allows; gpt-oss knows three efforts and one tier
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
_EFFORTS = {"none": "low", "minimal": "low", "xhigh": "high", "max": "high"}


def effort(value: str | None) -> ReasoningEffort:
    """The Harmony `Reasoning:` level: none and minimal → low, xhigh and max → high."""
    if value is None:
        return ReasoningEffort.MEDIUM
    return ReasoningEffort(_EFFORTS.get(value, value))


_VERBOSITY = {
    "low": "Keep the final answer short: say what is needed and no more.",
    "high": "Give a thorough final answer, with the detail and explanation that help.",
}


def verbosity_instruction(value: str | None) -> str:
    """`verbosity` as gpt-oss can take it: a developer instruction (low, high); medium adds nothing."""
    return _VERBOSITY.get(value or "", "")
