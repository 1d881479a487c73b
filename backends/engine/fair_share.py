"""Tenants' fair shares of one engine: virtual-time queuing on the tokens run for each.

A tenant's virtual time grows by the tokens the engine runs for it (prompt chunks and decoded tokens) over its
weight (GenerateRequest.weight). The waiting sequence admitted next is the head of the tenant furthest behind; the
prompt chunk a step runs is that of the prefilling sequence whose tenant is furthest behind; when pages run out,
the tenant furthest ahead gives up a sequence first; and a tenant below its share of the batch (its weight over
the active tenants' weights) takes a batch slot from the tenant most above its own. A tenant that was idle starts
level with the least served active tenant, so idleness banks no credit; a tenant alone gets the whole engine.
Within a tenant, sequences keep their arrival order.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from typing import Protocol


class Queued(Protocol):
    """What the fair share reads of a sequence (batcher.Sequence)."""

    arrived: int
    admitted: int

    @property
    def tenant(self) -> str: ...

    @property
    def weight(self) -> float: ...


class FairShare:
    def __init__(self) -> None:
        self._queues: dict[str, collections.deque[Queued]] = {}
        self._vtime: dict[str, float] = {}
        self._weights: dict[str, float] = {}
        self._arrivals = itertools.count()
        self._count = 0  # read by other threads (the engine's stats): an int, not the queues

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Queued]:
        for queue in list(self._queues.values()):
            yield from list(queue)

    def clear(self) -> None:
        self._queues.clear()
        self._count = 0

    def vtime(self, tenant: str) -> float:
        return self._vtime.get(tenant, 0.0)

    def push(self, sequence: Queued, running: list[Queued], again: bool = False) -> None:
        """Queue a sequence: new (at the back of its tenant's queue) or `again` after a preemption (at its front)."""
        tenant = sequence.tenant
        self._weights[tenant] = sequence.weight
        if tenant not in self._queues and not any(s.tenant == tenant for s in running):
            active = {s.tenant for s in running} | set(self._queues)
            floor = min((self.vtime(t) for t in active), default=0.0)
            self._vtime[tenant] = max(self.vtime(tenant), floor)
        queue = self._queues.setdefault(tenant, collections.deque())
        self._count += 1
        if again:
            queue.appendleft(sequence)
        else:
            sequence.arrived = next(self._arrivals)
            queue.append(sequence)

    def head(self) -> Queued | None:
        """The sequence to admit next: its tenant's first, of the tenant furthest behind."""
        heads = [queue[0] for queue in self._queues.values() if queue]
        return min(heads, key=lambda s: (self.vtime(s.tenant), s.arrived), default=None)

    def pop(self, sequence: Queued) -> None:
        queue = self._queues[sequence.tenant]
        queue.remove(sequence)
        self._count -= 1
        if not queue:
            del self._queues[sequence.tenant]

    def charge(self, sequence: Queued, tokens: int) -> None:
        tenant = sequence.tenant
        self._vtime[tenant] = self.vtime(tenant) + tokens / self._weights.get(tenant, sequence.weight)

    def first(self, sequences: list[Queued]) -> Queued | None:
        """Of `sequences`, the one whose tenant is furthest behind (the earliest admitted within a tenant)."""
        return min(sequences, key=lambda s: (self.vtime(s.tenant), s.admitted), default=None)

    def victim(self, running: list[Queued]) -> Queued:
        """The running sequence to preempt for pages: the latest admitted of the tenant furthest ahead."""
        return max(running, key=lambda s: (self.vtime(s.tenant), s.admitted))

    def claim(self, running: list[Queued], slots: int) -> tuple[Queued, Queued] | None:
        """With the batch full: (a waiting sequence, the running one it replaces) when a waiting tenant runs fewer
        than its share of `slots` and another tenant runs more than its own: the head of the waiting tenant
        furthest behind, and the latest admitted sequence of the tenant most above its share; else None."""
        tenants = {s.tenant for s in running} | set(self._queues)
        total = sum(self._weights.get(t, 1.0) for t in tenants)
        counts = collections.Counter(s.tenant for s in running)

        def share(tenant: str) -> float:
            return slots * self._weights.get(tenant, 1.0) / total

        below = [queue[0] for tenant, queue in self._queues.items() if counts[tenant] + 1 <= share(tenant)]
        above = {t for t in counts if counts[t] > share(t)}
        if not below or not above:
            return None
        waiting = min(below, key=lambda s: (self.vtime(s.tenant), s.arrived))
        most = max(above, key=lambda t: (counts[t] / self._weights.get(t, 1.0), self.vtime(t)))
        return waiting, max((s for s in running if s.tenant == most), key=lambda s: s.admitted)
