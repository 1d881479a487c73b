"""Tenants' fair shares of one engine: virtual-time queuing on the tokens run for each.

A tenant's virtual time grows by the tokens the engine runs for it (prompt chunks and decoded tokens) over its
weight (GenerateRequest.weight). The waiting sequence admitted next is the head of the tenant furthest behind; the
prompt chunk a step runs is that of the prefilling sequence whose tenant is furthest behind; when pages run out,
the tenant furthest ahead gives up a sequence first; and a tenant below its share of the batch (its weight over
the active tenants' weights) takes a batch slot from the tenant most above its own. A tenant that was idle starts
level with the least served active tenant, so idleness banks no credit; a tenant alone gets the whole engine.
Within a tenant, sequences are admitted in their arrival order, and of its prompts filling the one with the least left
goes first (a long prompt overtaken for at most about its own length: batcher.Sequence.precedence).

Service tiers come before all of that (GenerateRequest.tier; rank 0 priority, 1 default, 2 flex): a waiting
sequence of a better tier is admitted first, takes a full batch's slot from a running sequence of a worse tier,
and the worst tier gives up pages first; the fair share holds among the tenants of one tier. Flex therefore runs
only on the slots and pages the others leave.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from typing import Protocol

ARRIVAL_EDGE = 1e-3  # in tokens over weight: breaks a tie, banks nothing


class Queued(Protocol):
    """What the fair share reads of a sequence (batcher.Sequence)."""

    arrived: int
    admitted: int

    @property
    def tenant(self) -> str: ...

    @property
    def rank(self) -> int:
        """The service tier's rank: lower runs first."""
        ...

    @property
    def position(self) -> int:
        """Tokens whose KV it has written (what giving up its slot would waste)."""
        ...

    @property
    def weight(self) -> float: ...

    @property
    def precedence(self) -> int:
        """Its place among its tenant's prompts filling, lowest first (batcher.Sequence.precedence)."""
        ...


class FairShare:
    def __init__(self) -> None:
        self._queues: dict[tuple[int, str], collections.deque[Queued]] = {}  # by (tier rank, tenant)
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
        waiting = {t for _, t in self._queues}
        if tenant not in waiting and not any(s.tenant == tenant for s in running):
            active = {s.tenant for s in running} | waiting
            floor = min((self.vtime(t) for t in active), default=0.0)
            # level with the least served, a hair behind it: a tenant just come goes first on a tie
            self._vtime[tenant] = max(self.vtime(tenant), floor - ARRIVAL_EDGE)
        queue = self._queues.setdefault((sequence.rank, tenant), collections.deque())
        self._count += 1
        if again:
            queue.appendleft(sequence)
        else:
            sequence.arrived = next(self._arrivals)
            queue.append(sequence)

    def head(self) -> Queued | None:
        """The sequence to admit next: of the best tier waiting, the first of the tenant furthest behind."""
        heads = [queue[0] for queue in self._queues.values() if queue]
        return min(heads, key=lambda s: (s.rank, self.vtime(s.tenant), s.arrived), default=None)

    def before(self, sequence: Queued, other: Queued) -> bool:
        """Whether `sequence` runs before `other`: a better tier, or a tenant further behind."""
        return (sequence.rank, self.vtime(sequence.tenant)) < (other.rank, self.vtime(other.tenant))

    def pop(self, sequence: Queued) -> None:
        key = (sequence.rank, sequence.tenant)
        queue = self._queues[key]
        queue.remove(sequence)
        self._count -= 1
        if not queue:
            del self._queues[key]

    def charge(self, sequence: Queued, tokens: int) -> None:
        tenant = sequence.tenant
        self._vtime[tenant] = self.vtime(tenant) + tokens / self._weights.get(tenant, sequence.weight)

    def first(self, sequences: list[Queued]) -> Queued | None:
        """Of prompts filling, the best tier's whose tenant is furthest behind; within a tenant, the lowest
        precedence (the least left to fill, less what ran for the others while it waited), then the earliest
        admitted."""
        return min(sequences, key=lambda s: (s.rank, self.vtime(s.tenant), s.precedence, s.admitted), default=None)

    def victim(self, running: list[Queued]) -> Queued:
        """The running sequence to preempt for pages: of the worst tier, the latest admitted of the tenant
        furthest ahead."""
        return max(running, key=lambda s: (s.rank, self.vtime(s.tenant), s.admitted))

    def claim(self, running: list[Queued], slots: int) -> tuple[Queued, Queued] | None:
        """With the batch full: (a waiting sequence, the running one it replaces), else None. A waiting sequence
        of a better tier than a running one replaces one of the worst tier's. Within the best waiting tier, a
        tenant running fewer than its share of that tier's slots replaces one of the tenant most above its own:
        the head of the waiting tenant furthest behind. The one replaced has written the least (the latest
        admitted of those), so the least work is run again."""
        if not self._queues:
            return None
        best = min(rank for rank, _ in self._queues)
        worse = [s for s in running if s.rank > best]
        if worse:
            worst = max(s.rank for s in worse)
            return self._head_of(best, set(self._weights)), _cheapest([s for s in worse if s.rank == worst])
        peers = [s for s in running if s.rank == best]
        slots -= len(running) - len(peers)  # the better tiers' slots are theirs
        waiting = {tenant for rank, tenant in self._queues if rank == best}
        tenants = {s.tenant for s in peers} | waiting
        total = sum(self._weights.get(t, 1.0) for t in tenants)
        counts = collections.Counter(s.tenant for s in peers)

        def share(tenant: str) -> float:
            return slots * self._weights.get(tenant, 1.0) / total

        below = {tenant for tenant in waiting if counts[tenant] + 1 <= share(tenant)}
        above = {t for t in counts if counts[t] > share(t)}
        if not below or not above:
            return None
        most = max(above, key=lambda t: (counts[t] / self._weights.get(t, 1.0), self.vtime(t)))
        return self._head_of(best, below), _cheapest([s for s in peers if s.tenant == most])

    def _head_of(self, rank: int, tenants: set[str]) -> Queued:
        """The first waiting sequence of tier `rank` of the tenant in `tenants` furthest behind."""
        heads = [queue[0] for (r, tenant), queue in self._queues.items() if r == rank and tenant in tenants]
        return min(heads, key=lambda s: (self.vtime(s.tenant), s.arrived))


def _cheapest(candidates: list[Queued]) -> Queued:
    """Of running sequences, the one whose preemption wastes least: the fewest tokens written, then the latest."""
    return min(candidates, key=lambda s: (s.position, -s.admitted))
