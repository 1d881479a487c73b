"""Which held prefixes are shared: a prefix that several conversations continue differently (a system prompt a
tenant's users share) against one that a single conversation extends turn by turn.

The router notes, for each request it matched to a held prefix, the page the match ends on and the request's next
page (names in the tenant's namespace, backends/page_names.py). A page continued in SHARED_AFTER distinct ways is
a shared opening: the servers holding it get no preference over a less loaded server, so the opening is copied to
more servers as the first ones fill (a conversation's own history, continued one way at each depth, keeps its
server). Bounded: the most recently matched `capacity` pages, at most SHARED_AFTER continuations each.
"""

from __future__ import annotations

import collections

SHARED_AFTER = 3  # distinct continuations that make a prefix shared
CAPACITY = 4096  # pages remembered


class BranchPoints:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._next: collections.OrderedDict[bytes, set[bytes]] = collections.OrderedDict()

    def note(self, page: bytes, next_page: bytes) -> None:
        """A request matched up to `page` and goes on with `next_page`."""
        seen = self._next.get(page)
        if seen is None:
            seen = self._next[page] = set()
            while len(self._next) > self._capacity:
                self._next.popitem(last=False)
        else:
            self._next.move_to_end(page)
        if len(seen) < SHARED_AFTER:
            seen.add(next_page)

    def shared(self, page: bytes) -> bool:
        seen = self._next.get(page)
        return seen is not None and len(seen) >= SHARED_AFTER
