"""tool_choice and structured output: the backend constraint, and the check of outputs no backend enforced.

A backend that declares `constraints` gets the Constraint and enforces it while sampling. For one that
does not, the gateway checks the finished output against the same Constraint and, when the model broke
it, fails the response with code `constraint_not_enforced` instead of passing the output off as valid.
"""

from __future__ import annotations

import json
from typing import Any

from backends.base import Constraint

from ..intake.json_schemas import first_error
from .assembler import OutputItem

NOT_ENFORCED = "constraint_not_enforced"


def violation(constraint: Constraint, items: list[OutputItem]) -> str | None:
    """Why the finished output breaks the constraint, or None when it keeps it."""
    calls = [item for item in items if item.is_call or (item.is_hosted and item.kind != "mcp_list_tools")]
    if constraint.tools == "none" and calls:
        return f"tool_choice 'none' was not enforced: the model called '{calls[0].qualified_name}'"
    if constraint.tools == "required":
        if not calls:
            return "tool_choice required a tool call, and the model answered without one"
        strays = [call.qualified_name for call in calls if call.qualified_name not in constraint.tool_names]
        if strays:
            return f"tool_choice allowed {', '.join(constraint.tool_names)}, and the model called '{strays[0]}'"
    schema = constraint.final_json_schema
    if schema is not None:
        for item in items:
            if item.kind == "message" and not item.preamble:
                problem = _json_problem(item.text, schema)
                if problem:
                    return f"text.format was not enforced: {problem}"
    return None


def _json_problem(text: str, schema: dict[str, Any]) -> str | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"the answer is not JSON ({exc.msg} at character {exc.pos})"
    except RecursionError:
        return "the answer nests too deeply to read"
    error = first_error(schema, value)
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the root"
        return f"the answer does not match the schema at {where}: {error.message}"
    return None
