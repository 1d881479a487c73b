"""serde_json's number handling, as the reference renderer applies it to JSON Schema defaults.

The reference receives schemas as JSON text (Python's json.dumps), parses them with serde_json
(without `float_roundtrip`, so 16-17 digit floats can come out one ULP off) and prints values with
serde_json's Display (ryu's shortest float form, e.g. `1e20`, `1e-7`, `1.0`). Reproducing both is
what makes `// default: ...` comments token-exact.
"""

from __future__ import annotations

import json
import math
from typing import Any

_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)
_POW10 = [float(f"1e{i}") for i in range(309)]


def _overflows(significand: int, digit: int) -> bool:
    return significand >= _U64_MAX // 10 and (significand > _U64_MAX // 10 or digit > _U64_MAX % 10)


def _from_parts(negative: bool, significand: int, exponent: int) -> float:
    value = float(significand)
    while True:
        if abs(exponent) < len(_POW10):
            pow10 = _POW10[abs(exponent)]
            value = value * pow10 if exponent >= 0 else value / pow10
            break
        if value == 0.0:
            break
        if exponent >= 0:
            return math.inf
        value /= 1e308
        exponent += 308
    return -value if negative else value


def parse_number(text: str) -> int | float:
    """Parse a JSON number the way serde_json (default features) does."""
    negative = text.startswith("-")
    pos = 1 if negative else 0
    end = len(text)
    significand = 0
    exponent = 0
    is_float = False
    while pos < end and text[pos].isdigit():
        digit = ord(text[pos]) - 48
        if _overflows(significand, digit):
            is_float = True  # parse_long_integer: further integer digits only scale
            while pos < end and text[pos].isdigit():
                exponent += 1
                pos += 1
            break
        significand = significand * 10 + digit
        pos += 1
    if pos < end and text[pos] == ".":
        is_float = True
        pos += 1
        while pos < end and text[pos].isdigit():
            digit = ord(text[pos]) - 48
            if _overflows(significand, digit):
                while pos < end and text[pos].isdigit():  # parse_decimal_overflow drops the rest
                    pos += 1
                break
            significand = significand * 10 + digit
            exponent -= 1
            pos += 1
    if pos < end and text[pos] in "eE":
        is_float = True
        pos += 1
        exp_negative = text[pos] == "-"
        if text[pos] in "+-":
            pos += 1
        exp_value = int(text[pos:])
        exponent = exponent - exp_value if exp_negative else exponent + exp_value
    if not is_float:
        if not negative:
            return significand
        if -significand >= _I64_MIN:
            return -significand
        return -float(significand)
    return _from_parts(negative, significand, exponent)


def format_float(value: float) -> str:
    """ryu's shortest representation, as serde_json prints an f64."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    text = repr(value)
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exp_text = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    exponent = (int(exp_text) if exp_text else 0) - len(frac)
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    length = len(digits)
    kk = length + exponent
    if exponent >= 0 and kk <= 16:
        body = digits + "0" * exponent + ".0"
    elif 0 < kk <= 16:
        body = digits[:kk] + "." + digits[kk:]
    elif -5 < kk <= 0:
        body = "0." + "0" * -kk + digits
    elif length == 1:
        body = f"{digits}e{kk - 1}"
    else:
        body = f"{digits[0]}.{digits[1:]}e{kk - 1}"
    return sign + body


def display(value: Any) -> str:
    """serde_json's compact Display of a value that went through json.dumps → serde_json."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int) and _I64_MIN <= value <= _U64_MAX:
        return str(value)  # the digits json.dumps writes, which serde_json reads back as that integer
    if isinstance(value, int | float):
        number = parse_number(json.dumps(value)) if _is_finite(value) else math.nan
        return str(number) if isinstance(number, int) else format_float(number)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ",".join(display(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{display(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _is_finite(value: int | float) -> bool:
    return isinstance(value, int) or math.isfinite(value)
