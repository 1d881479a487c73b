"""A batch's input lines (`{"custom_id", "method", "url", "body"}` per line of JSONL), checked as a whole before any
runs, and the lines of its output and error files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..ids import new_id

MAX_CUSTOM_ID_CHARS = 512
MAX_REPORTED_ERRORS = 100


@dataclass(frozen=True, slots=True)
class BatchLine:
    number: int  # the line's number in the input file, from 1
    custom_id: str
    body: dict[str, Any]


def _error(code: str, message: str, param: str | None, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _check_line(raw: bytes, number: int, endpoint: str) -> tuple[BatchLine | None, dict[str, Any] | None]:
    try:
        entry = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, _error("invalid_json_line", "This line is not valid JSON.", None, number)
    if not isinstance(entry, dict):
        return None, _error("invalid_json_line", "Each line must be a JSON object.", None, number)
    custom_id = entry.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        message = f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID_CHARS} characters."
        return None, _error("missing_required_parameter", message, "custom_id", number)
    if entry.get("method") != "POST":
        return None, _error("invalid_value", "method must be 'POST'.", "method", number)
    if entry.get("url") != endpoint:
        message = f"url must be the batch's endpoint, '{endpoint}'."
        return None, _error("mismatched_endpoint", message, "url", number)
    body = entry.get("body")
    if not isinstance(body, dict):
        return None, _error("missing_required_parameter", "body must be a JSON object.", "body", number)
    if not isinstance(body.get("model"), str):
        return None, _error("missing_required_parameter", "body.model must be a string.", "body.model", number)
    unknown = set(entry) - {"custom_id", "method", "url", "body"}
    if unknown:
        message = f"Unknown parameter: '{sorted(unknown)[0]}'."
        return None, _error("unknown_parameter", message, sorted(unknown)[0], number)
    return BatchLine(number, custom_id, body), None


def parse_lines(content: bytes, endpoint: str, max_lines: int) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The file's requests, or the errors (at most MAX_REPORTED_ERRORS, each naming its line) that fail the
    batch: malformed lines, duplicate custom ids, a url other than the endpoint, more than one model."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None
    for number, raw in enumerate(content.split(b"\n"), 1):
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
        if not raw.strip():
            continue
        line, error = _check_line(raw, number, endpoint)
        if error is not None or line is None:
            errors.append(error or {})
            continue
        if line.custom_id in seen:
            errors.append(_error("duplicate_custom_id", "custom_id must be unique in a batch.", "custom_id", number))
            continue
        seen.add(line.custom_id)
        if model is None:
            model = line.body["model"]
        elif line.body["model"] != model:
            message = f"Every request in a batch must use the same model ('{model}')."
            errors.append(_error("mismatched_model", message, "body.model", number))
            continue
        lines.append(line)
    if not errors and not lines:
        errors.append(_error("empty_file", "The input file holds no requests.", None, None))
    if len(lines) > max_lines:
        message = f"A batch holds at most {max_lines} requests; this file holds {len(lines)}."
        errors.append(_error("too_many_requests", message, None, None))
    return lines, errors


def answer_line(custom_id: str, status: int, request_id: str, body: Any) -> dict[str, Any]:
    """A line of the output file (2xx) or of the error file (any other status)."""
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def failed_line(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """A line of the error file for a request that got no answer (the batch expired or was cancelled first)."""
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def succeeded(result: dict[str, Any]) -> bool:
    response = result.get("response")
    return response is not None and 200 <= response["status_code"] < 300


def usage_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch's `usage`: the answered requests' tokens summed (Responses and Chat Completions usage alike)."""
    total = {"input": 0, "cached": 0, "output": 0, "reasoning": 0}
    for result in results:
        if not succeeded(result):
            continue
        usage = (result["response"]["body"] or {}).get("usage") or {}
        details_in = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
        details_out = usage.get("output_tokens_details") or usage.get("completion_tokens_details") or {}
        total["input"] += usage.get("input_tokens", usage.get("prompt_tokens", 0)) or 0
        total["output"] += usage.get("output_tokens", usage.get("completion_tokens", 0)) or 0
        total["cached"] += details_in.get("cached_tokens", 0) or 0
        total["reasoning"] += details_out.get("reasoning_tokens", 0) or 0
    return {
        "input_tokens": total["input"],
        "input_tokens_details": {"cached_tokens": total["cached"]},
        "output_tokens": total["output"],
        "output_tokens_details": {"reasoning_tokens": total["reasoning"]},
        "total_tokens": total["input"] + total["output"],
    }
