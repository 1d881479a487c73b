"""Token log-probabilities as both APIs show them: `{token, logprob, bytes, top_logprobs}` per generated token of
the final answer, alternatives most likely first. A token that is not whole UTF-8 on its own is named
`bytes:\\xe2\\x80…` (its bytes are exact in `bytes`)."""

from __future__ import annotations

from typing import Any

from backends.base import TokenLogprob
from harmony import HarmonyEncoding


class LogprobWriter:
    """Formats a backend's logprobs for one response, each token's text decoded once."""

    def __init__(self, encoding: HarmonyEncoding, top: int) -> None:
        self._encoding = encoding
        self._top = top
        self._named: dict[int, tuple[str, list[int]]] = {}

    def _name(self, token: int) -> tuple[str, list[int]]:
        named = self._named.get(token)
        if named is None:
            raw = self._encoding.decode_bytes([token])
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
            named = self._named[token] = (text, list(raw))
        return named

    def token(self, token: int, entry: TokenLogprob) -> dict[str, Any]:
        text, raw = self._name(token)
        alternatives = []
        for other, logprob in entry.top[: self._top]:
            other_text, other_raw = self._name(other)
            alternatives.append({"token": other_text, "logprob": logprob, "bytes": other_raw})
        return {"token": text, "logprob": entry.logprob, "bytes": raw, "top_logprobs": alternatives}
