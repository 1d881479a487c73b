"""What one model server holds of which prompts, as page names (backends/page_names.py).

Precise where the server says what it stores and evicts (the built-in engine's servers: `PublishedPages`, kept by
kv_events.py); approximate where it does not (`RoutedPages`: the pages of what was sent to it, forgotten after
`ttl_s` unused, or the least recently used first beyond `capacity` pages, as the server's own cache would forget
them). Either answers one question: how many of a prompt's leading pages does it hold.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable


class RoutedPages:
    """Approximate: the pages routed to a server, with when each was last used."""

    def __init__(self, capacity: int, ttl_s: float) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._used: collections.OrderedDict[bytes, float] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._used)

    def add(self, names: Iterable[bytes]) -> None:
        now = time.monotonic()
        for name in names:
            self._used[name] = now
            self._used.move_to_end(name)
        while len(self._used) > self.capacity:
            self._used.popitem(last=False)

    def held(self, names: Iterable[bytes]) -> int:
        """Leading pages of `names` held (a page not used within `ttl_s` counts as forgotten)."""
        oldest = time.monotonic() - self.ttl_s
        count = 0
        for name in names:
            used = self._used.get(name)
            if used is None or used < oldest:
                break
            count += 1
        return count

    def clear(self) -> None:
        self._used.clear()


class PublishedPages:
    """Precise: the pages a server says it holds, from its event stream (None while the stream is not in sync)."""

    def __init__(self) -> None:
        self.instance: str | None = None
        self.page_size = 0
        self.shared_scope = False
        self.by_salt = False  # pages named in their `cache_salt`'s namespace (vLLM's), not their tenant's
        self.seq = 0
        self.names: set[bytes] | None = None

    @property
    def in_sync(self) -> bool:
        return self.names is not None and self.page_size > 0

    def reset(self, instance: str, page_size: int, shared_scope: bool, seq: int, names: Iterable[bytes]) -> None:
        self.instance, self.page_size, self.shared_scope, self.seq = instance, page_size, shared_scope, seq
        self.names = set(names)

    def apply(self, first: int, seq: int, stored: Iterable[tuple[str, bytes]]) -> bool:
        """Events `first`..`seq` in order, as (kind "s" or "r", name); False (and out of sync) on a gap."""
        if self.names is None or first != self.seq + 1:
            self.lose()
            return False
        for kind, name in stored:
            if kind == "s":
                self.names.add(name)
            else:
                self.names.discard(name)
        self.seq = seq
        return True

    def lose(self) -> None:
        """The stream stopped or lied: nothing is known until the next snapshot."""
        self.names = None

    def held(self, names: Iterable[bytes]) -> int:
        if self.names is None:
            return 0
        count = 0
        for name in names:
            if name not in self.names:
                break
            count += 1
        return count
