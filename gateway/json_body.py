"""Request bodies: JSON that parses within bounds, nests at most MAX_DEPTH deep and holds only encodable text.

Python's json module accepts `"\\ud800"` (a lone surrogate) and recurses once per nesting level, so a
body can parse into text that cannot be stored or rendered, or not parse at all for lack of stack.
Both are the client's error: a 400 naming where in the body it is, before any work is done.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from .errors import ApiError, from_validation, invalid
from .services import SERVICES

ModelT = TypeVar("ModelT", bound=BaseModel)
MAX_DEPTH = 64  # JSON nesting levels of a request body (a JSON Schema inside counts with its own levels)


def _where(path: tuple[str | int, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_tree(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """A 400 for nesting past `max_depth` or a string (or key) that is not valid Unicode (iterative walk)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _unencodable(node):
                raise invalid(_where(path) or None, f"'{_where(path) or 'body'}' holds a lone UTF-16 surrogate.")
            continue
        if len(path) >= max_depth and isinstance(node, dict | list) and node:
            raise invalid(_where(path), f"'{_where(path)}' nests deeper than {max_depth} levels.", "nested_too_deep")
        if isinstance(node, dict):
            for key, item in node.items():
                if _unencodable(key):
                    raise invalid(_where(path) or None, f"A key in '{_where(path) or 'body'}' is not valid Unicode.")
                stack.append((item, (*path, key)))
        elif isinstance(node, list):
            stack.extend((item, (*path, index)) for index, item in enumerate(node))


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or a 400/413 that says what is wrong with it."""
    try:
        if request.content.is_eof():  # all of it arrived with the head (a small body): nothing to wait for
            raw = await request.read()
        else:
            async with asyncio.timeout(request.app[SERVICES].settings.body_timeout_s):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"Request body too large. {exc.text}", code="request_too_large") from exc
    except TimeoutError:
        raise ApiError(408, "The request body did not arrive in time.", code="request_timeout") from None
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError:
        raise invalid(None, f"The request body nests deeper than {MAX_DEPTH} levels.", "nested_too_deep") from None
    check_tree(body)
    return body


async def read_model(request: web.Request, model: type[ModelT], tags: frozenset[str] = frozenset()) -> ModelT:
    """The JSON body validated as `model`; `tags` name the union tags to leave out of parameter paths."""
    return parse_model(await read_json(request), model, tags)


def parse_model(body: Any, model: type[ModelT], tags: frozenset[str] = frozenset()) -> ModelT:
    """A JSON body already read, validated as `model` (400s as read_model gives them)."""
    if not isinstance(body, dict):
        raise invalid(None, "The request body must be a JSON object.", "invalid_type")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc, tags) from exc
