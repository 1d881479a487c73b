"""Request bodies: JSON that parses within bounds, nests at most MAX_DEPTH deep and holds only encodable text.

Python's json module accepts `"\\ud800"` (a lone surrogate) and recurses once per nesting level, so a
body can parse into text that cannot be stored or rendered, or not parse at all for lack of stack.
Both are the client's error: a 400 naming where in the body it is, before any work is done.

Nothing here holds the event loop past its budget: a compressed body (gzip, deflate, zstd, br) is inflated,
at most GATEWAY_MAX_BODY_BYTES of it, and a body past OFFLOAD_BYTES parsed and checked, as the tenant's costly
work, in a checker process (checker_pool.py). Where no checker answers, a worker thread decodes it: past
C_PARSE_BYTES by the json module's Python scanner, which lets the loop run between its steps (the C parser holds
the interpreter for its whole run: ~30 ms a MiB here).
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD, BrotliDecompressor, ZLibDecompressor, ZSTDDecompressor
from pydantic import BaseModel, ValidationError

from .checker_pool import Check
from .costly_work import pace
from .errors import ApiError, from_validation, invalid
from .services import SERVICES

ModelT = TypeVar("ModelT", bound=BaseModel)
MAX_DEPTH = 64  # JSON nesting levels of a request body (a JSON Schema inside counts with its own levels)
OFFLOAD_BYTES = 64 * 1024  # a body this large or larger is decoded in a worker thread
C_PARSE_BYTES = 1024 * 1024  # up to this, the C parser (one uninterrupted run of ~30 ms at most)
BODY_BYTES = web.RequestKey("body_bytes", int)  # the decoded body's size, once read


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
        pace()
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


async def read_json(request: web.Request, tenant: str, check: Check | None = None) -> Any:
    """The request body as JSON, or a 400/413/415 that says what is wrong with it. `check`: the API's checks of
    the body alone, run on a large body in a checker process before the gateway decodes it (they run again later
    on the request path: a small body, or one no checker could take, gets them there)."""
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
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    services = request.app[SERVICES]
    settings = services.settings
    limit = min(settings.max_body_bytes, settings.limits.for_tenant(tenant).max_body_bytes or settings.max_body_bytes)
    if encoding == "identity" and len(raw) < OFFLOAD_BYTES:
        request[BODY_BYTES] = len(raw)
        return parse_json(raw)
    checked = await services.costly.check(tenant, raw, encoding, limit, check)
    if checked is not None:
        request[BODY_BYTES] = checked.size
        return checked.body
    body, size = await services.costly.run(tenant, lambda: decode_body(raw, encoding, limit, stepwise=True))
    request[BODY_BYTES] = size
    return body


def body_bytes(request: web.Request) -> int | None:
    """The size of the body read_json decoded (None before it did)."""
    return request.get(BODY_BYTES)


def decode_body(raw: bytes, encoding: str, limit: int, *, stepwise: bool) -> tuple[Any, int]:
    """(the JSON, its size) of a body as sent: inflated to at most `limit` bytes, then parsed (`stepwise`: as
    parse_json does in the gateway's own threads; a checker process parses in one run)."""
    if encoding != "identity":
        raw = _inflated(raw, encoding, limit)
    return parse_json(raw, stepwise), len(raw)


def _inflated(raw: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("gzip", "x-gzip", "deflate"):
        raw_deflate = encoding == "deflate" and bool(raw) and raw[0] & 0x0F != 8  # no zlib header (RFC 1950)
        decompressor: Any = ZLibDecompressor(encoding=encoding, suppress_deflate_header=raw_deflate)
    elif encoding == "zstd" and HAS_ZSTD:
        decompressor = ZSTDDecompressor()
    elif encoding == "br" and HAS_BROTLI:
        decompressor = BrotliDecompressor()
    else:
        message = f"Content-Encoding '{encoding}' is not supported: send gzip, deflate, zstd or identity."
        raise ApiError(415, message, code="unsupported_content_encoding")
    try:
        inflated = decompressor.decompress_sync(raw, limit + 1)
    except Exception as exc:  # each library raises its own error for a corrupt stream
        raise ApiError(400, f"The request body is not valid {encoding} data.", code="invalid_encoding") from exc
    if len(inflated) > limit:
        message = f"Request body too large: past {limit} bytes once decompressed (GATEWAY_MAX_BODY_BYTES)."
        raise ApiError(413, message, code="request_too_large")
    return inflated


def parse_json(raw: bytes, stepwise: bool = True) -> Any:
    """JSON within the bounds above (call it off the loop past OFFLOAD_BYTES), or the 400 that says why not.
    `stepwise`: past C_PARSE_BYTES, in paced steps."""
    try:
        if len(raw) <= C_PARSE_BYTES or not stepwise:
            body = json.loads(raw)
        else:
            text = raw.decode(json.detect_encoding(raw), "surrogatepass")
            body = _stepwise_decoder().decode(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError:
        raise invalid(None, f"The request body nests deeper than {MAX_DEPTH} levels.", "nested_too_deep") from None
    if _may_break_bounds(raw):
        check_tree(body)
    return body


def _may_break_bounds(raw: bytes) -> bool:
    """Whether check_tree could find anything in the parsed body: in UTF-8, a lone surrogate needs a `\\u`
    escape or the bytes that would encode one (ED A0-BF), and nesting past MAX_DEPTH needs more brackets."""
    if b"\\u" in raw or b"\xed" in raw or json.detect_encoding(raw) != "utf-8":
        return True
    return raw.count(b"[") + raw.count(b"{") > MAX_DEPTH


def _stepwise_decoder() -> json.JSONDecoder:
    """The json module's decoder on its Python scanner: the same JSON and errors, in steps that give the event
    loop its turns (each object and array paces)."""
    decoder = json.JSONDecoder()
    parse_object, parse_array = decoder.parse_object, decoder.parse_array

    def paced_object(*args: Any) -> Any:
        pace()
        return parse_object(*args)

    def paced_array(*args: Any) -> Any:
        pace()
        return parse_array(*args)

    decoder.parse_object, decoder.parse_array = paced_object, paced_array  # type: ignore[method-assign]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


async def read_model(
    request: web.Request,
    tenant: str,
    model: type[ModelT],
    tags: frozenset[str] = frozenset(),
    check: Check | None = None,
) -> ModelT:
    """The JSON body validated as `model`; `tags` name the union tags to leave out of parameter paths; `check`
    as read_json takes it."""
    return parse_model(await read_json(request, tenant, check), model, tags)


def parse_model(body: Any, model: type[ModelT], tags: frozenset[str] = frozenset()) -> ModelT:
    """A JSON body already read, validated as `model` (400s as read_model gives them)."""
    if not isinstance(body, dict):
        raise invalid(None, "The request body must be a JSON object.", "invalid_type")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc, tags) from exc
