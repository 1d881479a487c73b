"""JSON as compact UTF-8 bytes and back, losslessly: orjson writes, and the json module writes what orjson
refuses (integers past 64 bits, which a client's JSON Schema may hold) and reads everything (orjson would
read such an integer as a float)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def loads(data: bytes | str) -> Any:
    return json.loads(data)
