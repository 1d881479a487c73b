"""Which server to warm with a hot shared prefix, so that no request waits for that prefix's prefill there.

A prefix is hot when requests of different sessions matched it within `window_s`: a tenant's users on one long
system prompt, whose prompts part ways after it, not a conversation's turns (each turn's match ends in a page only
that conversation wrote, and its own next turn ends elsewhere again). While the server chosen for a request on a hot
prefix is busier than a healthy server that does not hold it, the router names the least loaded of those (ties
broken by the prefix, alike on every replica) and the backend sends it the prefix alone, asking one token, at the
`flex` tier: that server prefills it beside its own work, and later requests on the prefix spread over one more
server holding it instead of piling onto the first, or each paying the prefill where it is not held.

Bounded: one warm-up of a prefix on a server per `window_s` (done, or failed: the server is not warmed again before
then), at most `most_at_once` in flight from a replica, and the prefixes seen kept to `capacity`, the least
recently matched forgotten first.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

MOST_AT_ONCE = 4  # warm-ups in flight from one replica
CAPACITY = 4096  # prefixes remembered


@dataclass(slots=True)
class _Seen:
    anchor: bytes  # the last request's own (its prompt's last page name)
    at: float
    hot_until: float = 0.0


class PrefixWarming:
    def __init__(
        self,
        window_s: float,
        capacity: int = CAPACITY,
        most_at_once: int = MOST_AT_ONCE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.capacity = capacity
        self.most_at_once = most_at_once
        self._clock = clock
        self._seen: collections.OrderedDict[bytes, _Seen] = collections.OrderedDict()
        self._warmed: dict[tuple[bytes, str], float] = {}  # (prefix, url) → when its warm-up was sent
        self._in_flight: collections.Counter[tuple[bytes, str]] = collections.Counter()
        self.sent = 0  # warm-ups sent since start

    def hot(self, prefix: bytes, anchor: bytes) -> bool:
        """Note that a request (`anchor`: its own) matched `prefix`; whether requests of different sessions did
        within the window."""
        now = self._clock()
        seen = self._seen.pop(prefix, None)
        if seen is None:
            seen = _Seen(anchor, now)
        else:
            if seen.anchor != anchor and now - seen.at <= self.window_s:
                seen.hot_until = now + self.window_s
            seen.anchor, seen.at = anchor, now
        self._seen[prefix] = seen
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return seen.hot_until >= now

    def may_warm(self, prefix: bytes, url: str) -> bool:
        """Whether a warm-up of `prefix` may go to `url` now."""
        if self._in_flight.total() >= self.most_at_once:
            return False
        sent = self._warmed.get((prefix, url))
        return sent is None or self._clock() - sent > self.window_s

    def start(self, prefix: bytes, url: str) -> None:
        now = self._clock()
        self._warmed = {key: at for key, at in self._warmed.items() if now - at <= self.window_s}
        self._warmed[(prefix, url)] = now
        self._in_flight[(prefix, url)] += 1
        self.sent += 1

    def at(self, prefix: bytes) -> set[str]:
        """The servers a warm-up of `prefix` is in flight to."""
        return {url for (name, url), count in self._in_flight.items() if name == prefix and count > 0}

    def done(self, prefix: bytes, url: str) -> None:
        """A warm-up ended (answered or failed)."""
        self._in_flight[(prefix, url)] -= 1
        if self._in_flight[(prefix, url)] <= 0:
            del self._in_flight[(prefix, url)]
