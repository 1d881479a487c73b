"""The o200k_harmony encoding: o200k_base BPE on tiktoken plus the Harmony special tokens."""

from __future__ import annotations

import functools
import os
import re

import tiktoken

from .header import HeaderCache
from .tokens import SPECIAL_TEXT, SPECIAL_TOKENS, VOCAB_SIZE
from .vocab import load_vocabulary_bytes, parse_ranks

# The pre-tokenisation regex of o200k_base (tiktoken_ext/openai_public.py).
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


_SPECIAL_MARK = re.compile(r"(<\|[a-z_0-9]+\|>)")


class HarmonyEncoding:
    """Tokenizer for Harmony prompts; text is only ever encoded as ordinary text."""

    name = "o200k_harmony"

    def __init__(self, mergeable_ranks: dict[bytes, int]) -> None:
        self._tiktoken = tiktoken.Encoding(
            self.name,
            pat_str=O200K_PATTERN,
            mergeable_ranks=mergeable_ranks,
            special_tokens=SPECIAL_TOKENS,
        )
        table = [b""] * VOCAB_SIZE
        for token_bytes, rank in mergeable_ranks.items():
            table[rank] = token_bytes
        for token, text in SPECIAL_TEXT.items():
            table[token] = text.encode()
        self.token_bytes: list[bytes] = table  # index = token id; specials hold their text
        self.headers = HeaderCache(table)  # message headers the parsers read, parsed once each
        # the text of each token met whose bytes are whole UTF-8 on their own (most are), filled by the parsers:
        # at most one entry a token of the vocabulary
        self.whole_texts: dict[int, str] = {}
        self.mergeable_ranks = mergeable_ranks
        self.pattern = O200K_PATTERN
        self.encode_ordinary = self._tiktoken.encode_ordinary

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def decode_bytes(self, tokens: list[int]) -> bytes:
        """Bytes of the tokens; ids outside the vocabulary are skipped."""
        table = self.token_bytes
        size = len(table)
        return b"".join(table[t] for t in tokens if 0 <= t < size)

    def decode(self, tokens: list[int]) -> str:
        return self.decode_bytes(tokens).decode("utf-8", errors="replace")

    def encode_marked(self, text: str) -> list[int]:
        """Tokens of scripted text whose `<|name|>` marks stand for special tokens.

        For mock output and tests only: text from users is always encoded with encode_ordinary.
        """
        out: list[int] = []
        for piece in _SPECIAL_MARK.split(text):
            special = SPECIAL_TOKENS.get(piece)
            if special is not None:
                out.append(special)
            elif piece:
                out += self.encode_ordinary(piece)
        return out


@functools.lru_cache(maxsize=4)
def _load(path: str | None) -> HarmonyEncoding:
    return HarmonyEncoding(parse_ranks(load_vocabulary_bytes(path)))


def load_harmony_encoding(vocab_path: str | os.PathLike[str] | None = None) -> HarmonyEncoding:
    """The shared encoding; loaded once per vocabulary path."""
    return _load(None if vocab_path is None else os.fspath(vocab_path))
