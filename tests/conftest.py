from __future__ import annotations

import os
import re
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

from harmony import Renderer, load_harmony_encoding
from harmony.tokens import SPECIAL_TOKENS

settings.register_profile("default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_SPECIAL_SPLIT = re.compile(r"(<\|[a-z_0-9]+\|>)")


@pytest.fixture(scope="session")
def encoding():
    return load_harmony_encoding()


@pytest.fixture(scope="session")
def renderer(encoding):
    return Renderer(encoding)


def marked_tokens(encoding, text: str) -> list[int]:
    """Tokens of text in which `<|name|>` marks stand for special tokens."""
    out: list[int] = []
    for piece in _SPECIAL_SPLIT.split(text):
        if piece in SPECIAL_TOKENS:
            out.append(SPECIAL_TOKENS[piece])
        elif piece:
            out += encoding.encode_ordinary(piece)
    return out


@pytest.fixture(scope="session")
def tok(encoding):
    return lambda text: marked_tokens(encoding, text)
