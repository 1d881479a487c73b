"""The engine's record of the KV pages its prefix cache names: what a router reads to know what it holds.

The prefix cache reports each page it names (stored, with its parent in the chain) and each name it drops
(removed: evicted, or forgotten after a failed step), on the engine thread. Readers on other threads take a
snapshot (every name held now, as of a sequence number) and then the events after it; a reader that falls
more than `capacity` events behind is told so and takes a snapshot again. `instance` is new at every start,
so a reader sees a restarted engine (whose cache is empty) as a different one.
"""

from __future__ import annotations

import collections
import itertools
import secrets
import threading
from dataclasses import dataclass

STORED = "stored"
REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class PageEvent:
    seq: int
    kind: str  # STORED or REMOVED
    name: bytes
    parent: bytes = b""  # for STORED: the previous page's name (the namespace's hash for a first page)


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int  # the last event it includes
    names: dict[bytes, bytes]  # every page named now → its parent


class PageEvents:
    def __init__(self, capacity: int = 65_536) -> None:
        self.instance = secrets.token_hex(8)
        self._lock = threading.Lock()
        self._seq = 0
        self._events: collections.deque[PageEvent] = collections.deque(maxlen=capacity)
        self._names: dict[bytes, bytes] = {}

    @property
    def seq(self) -> int:
        return self._seq

    def stored(self, name: bytes, parent: bytes) -> None:
        with self._lock:
            self._seq += 1
            self._events.append(PageEvent(self._seq, STORED, name, parent))
            self._names[name] = parent

    def removed(self, name: bytes) -> None:
        with self._lock:
            self._seq += 1
            self._events.append(PageEvent(self._seq, REMOVED, name))
            self._names.pop(name, None)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(self._seq, dict(self._names))

    def since(self, seq: int, limit: int = 4096) -> list[PageEvent] | None:
        """The events after `seq`, at most `limit` of them; None when some of them are no longer kept."""
        with self._lock:
            if seq >= self._seq:
                return []
            if not self._events or self._events[0].seq > seq + 1:
                return None
            start = seq + 1 - self._events[0].seq
            return list(itertools.islice(self._events, start, start + limit))
