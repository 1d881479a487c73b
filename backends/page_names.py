"""The names of KV pages: a hash chain over a prompt's token ids within a cache namespace.

The built-in engine names each full page of a sequence so (its prefix cache finds pages by these names), and
its servers publish the names they store and evict; a router that computes the same names from a prompt knows
which server holds how much of it. Equal names mean equal tokens from position 0 on, in the same namespace.
"""

from __future__ import annotations

from collections.abc import Iterator
from hashlib import blake2b

import numpy as np

ROOT = b"gpt-oss-gateway prefix v1"


def namespace_of(tenant: str, cache_key: str | None, shared: bool) -> bytes:
    """The cache namespace of a request: its tenant's (unless the operator shares one), split by its cache key."""
    scope = "" if shared else tenant
    return blake2b(f"{scope}\x1f{cache_key or ''}".encode(), digest_size=16, key=ROOT).digest()


def chain(namespace: bytes, tokens: list[int], block: int, previous: bytes | None = None) -> Iterator[bytes]:
    """The chain names of the full blocks of `tokens`, lazily (`previous`: the name of the block before them)."""
    name = namespace if previous is None else previous
    ids = np.asarray(tokens[: len(tokens) // block * block], dtype=np.int32).tobytes()
    width = block * 4
    for start in range(0, len(ids), width):
        name = blake2b(name + ids[start : start + width], digest_size=16).digest()
        yield name


class LazyChain:
    """A chain's names, hashed only as far as they are read, and once however often they are read."""

    def __init__(self, names: Iterator[bytes]) -> None:
        self._names = names
        self._known: list[bytes] = []

    def __iter__(self) -> Iterator[bytes]:
        yield from self._known
        for name in self._names:
            self._known.append(name)
            yield name

    def at(self, index: int) -> bytes | None:
        """The name at `index` (None past the chain's end), hashing only up to it."""
        while len(self._known) <= index:
            name = next(self._names, None)
            if name is None:
                return None
            self._known.append(name)
        return self._known[index]
