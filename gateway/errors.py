"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import structlog
from aiohttp import web
from pydantic import ValidationError

from state import StoreUnavailable

from .json_out import json_response

log = structlog.get_logger("gateway.errors")


class ApiError(Exception):
    """An error the client gets as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return json_response(self.body(), status=self.status, headers=self.headers)


def invalid(param: str | None, message: str, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(param: str | None, message: str) -> ApiError:
    return ApiError(404, message, param=param, code="not_found")


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, code="service_unavailable", kind="server_error")


@contextlib.contextmanager
def store_unavailable_as_503(message: str) -> Iterator[None]:
    """A StoreUnavailable in the block becomes the client's 503 with `message`."""
    try:
        yield
    except StoreUnavailable as exc:
        raise unavailable(message) from exc


_SCALAR_LABELS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _is_branch_label(part: str, after_index: bool, tags: frozenset[str]) -> bool:
    """Union branches in pydantic locations: type labels, model names, and union tags after a list index."""
    return "[" in part or part in _SCALAR_LABELS or part[:1].isupper() or (after_index and part in tags)


def param_path(loc: tuple[int | str, ...], tags: frozenset[str] = frozenset(), prefix: str = "") -> str:
    """A pydantic location as the dotted/bracketed path OpenAI names parameters with.

    `tags` are the discriminator values of list-element unions, which pydantic puts in the location.
    """
    path = prefix
    after_index = False
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            after_index = True
            continue
        if not _is_branch_label(part, after_index, tags):
            path += f".{part}" if path else part
        after_index = False
    return path


def from_validation(exc: ValidationError, tags: frozenset[str] = frozenset(), prefix: str = "") -> ApiError:
    """The most specific validation failure (deepest location), naming the offending parameter; among a
    union's branches, one of the input's kind (an object's tag, not the string choices it is not)."""
    errors = exc.errors(include_url=False)
    paths = [param_path(tuple(error["loc"]), tags, prefix) for error in errors]
    rank = [
        (path.count(".") + path.count("["), error["type"] != "literal_error" or isinstance(error.get("input"), str))
        for path, error in zip(paths, errors, strict=True)
    ]
    best = rank.index(max(rank))
    first, param = errors[best], paths[best]
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    if first["type"] == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    message = first["msg"].removeprefix("Value error, ")
    return ApiError(400, f"Invalid '{param}': {message}", param=param, code="invalid_value")


_STATUS_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def error_response(request: web.Request, exc: Exception) -> web.StreamResponse:
    """An exception out of a route, in an `except` block, as the API's error response (an HTTP redirect or other
    status below 400 is raised again); an unexpected one is logged, with its traceback, and answered as a 500."""
    if isinstance(exc, ApiError):
        return exc.response()
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return ApiError(exc.status, exc.reason, code=_STATUS_CODES.get(exc.status)).response()
    log.exception("unhandled_error", path=request.path, method=request.method)
    return ApiError(500, "The server had an error processing the request.", kind="server_error").response()
