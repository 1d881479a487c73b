"""Decoding a request body as sent: inflated (gzip, deflate, zstd, br) to at most a limit, parsed as JSON that
nests at most MAX_DEPTH deep and holds only encodable text.

Python's json module accepts `"\\ud800"` (a lone surrogate) and recurses once per nesting level, so a body can
parse into text that cannot be stored or rendered, or not parse at all for lack of stack. Both are the client's
error: a 400 naming where in the body it is. Past C_PARSE_BYTES, the json module's Python scanner parses in paced
steps (pacing.py), as the C parser holds the interpreter for its whole run (~30 ms a MiB here). The gateway's
threads and its checker processes (checker_pool.py) decode with it alike.
"""

from __future__ import annotations

import json
import json.scanner
from typing import Any

from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD, BrotliDecompressor, ZLibDecompressor, ZSTDDecompressor

from ..errors import ApiError, invalid
from .pacing import pace

MAX_DEPTH = 64  # JSON nesting levels of a request body (a JSON Schema inside counts with its own levels)
C_PARSE_BYTES = 1024 * 1024  # up to this, the C parser (one uninterrupted run of ~30 ms at most)


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
