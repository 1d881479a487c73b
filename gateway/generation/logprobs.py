"""Token log-probabilities as both APIs show them: `{token, logprob, bytes, top_logprobs}` per generated token of
the final answer, alternatives most likely first. A token that is not whole UTF-8 on its own is named
`bytes:\\xe2\\x80…` (its bytes are exact in `bytes`). Every token whose text becomes answer text carries its
logprob, those of a malformed header that the parser read as text included, so the tokens' bytes make up exactly
the answer."""

from __future__ import annotations

from typing import Any

from backends.base import TokenLogprob
from harmony import HarmonyEncoding
from harmony.tokens import CHANNEL, CONSTRAIN, FIRST_SPECIAL, START


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

    def token(self, token: int, entry: TokenLogprob, shown: bytes | None = None) -> dict[str, Any]:
        """`shown`: the part of the token that became text, when a repair read only its end as content."""
        text, raw = self._name(token)
        if shown is not None and shown != bytes(raw):
            raw = list(shown)
            text = shown.decode("utf-8", errors="replace")
        alternatives = []
        for other, logprob in entry.top[: self._top]:
            other_text, other_raw = self._name(other)
            alternatives.append({"token": other_text, "logprob": logprob, "bytes": other_raw})
        return {"token": text, "logprob": entry.logprob, "bytes": raw, "top_logprobs": alternatives}


class HeaderTokens:
    """The tokens of the message header being read, with their logprobs: a header that never reaches
    `<|message|>` is read as text (the parser's repair), and those tokens then carry that text's logprobs."""

    def __init__(self, encoding: HarmonyEncoding, writer: LogprobWriter) -> None:
        self._encoding = encoding
        self._writer = writer
        self._tokens: list[tuple[int, TokenLogprob | None]] = []

    def add(self, token: int, entry: TokenLogprob | None) -> None:
        if token == START:
            self._tokens = []
        elif 0 <= token < FIRST_SPECIAL or token in (CHANNEL, CONSTRAIN):  # what a header's text is read from
            self._tokens.append((token, entry))

    def clear(self) -> None:
        self._tokens = []

    def read_as(self, text: str) -> list[dict[str, Any]]:
        """The logprobs of the header's last tokens that hold `text` (the shortest run from the end that
        decodes to it); the first of them shown by its part in the text."""
        pieces = [self._encoding.decode_bytes([token]) for token, _ in self._tokens]
        tail, first, lead = b"", 0, 0
        for index in range(len(pieces) - 1, -1, -1):
            tail = pieces[index] + tail
            decoded = tail.decode("utf-8", errors="replace")
            if decoded.endswith(text):
                first, lead = index, len(decoded[: len(decoded) - len(text)].encode())
                break
        scored = []
        for index in range(first, len(self._tokens)):
            token, entry = self._tokens[index]
            if entry is not None:
                shown = pieces[index][lead:] if index == first else None
                scored.append(self._writer.token(token, entry, shown))
        self._tokens = []
        return scored
