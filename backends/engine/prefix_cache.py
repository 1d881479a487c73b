"""Which KV slot holds which token prefix, so that a new sequence prefills only what no slot already holds.

A slot's cache is cut into blocks of `block` positions. A block is named by a hash chain: the hash of the
cache's namespace (tenant, and `prompt_cache_key` when given), the previous block's name and the block's
tokens, so equal names mean equal tokens from position 0 on, in the same namespace. A slot registers each
block once its KV is written (prompt chunks, then every generated token fed back); a new sequence looks up
the longest chain of its prompt's blocks that some slot holds.

A slot is running (held by a sequence: never overwritten by another), idle (its sequence ended; its blocks
stay findable, least recently used first out) or empty. Idle slots keep at most `budget` tokens in all;
past it the least recently used idle slot loses blocks from its end. Blocks live where the slots put them:
a block is found in place (the slot is taken over) or copied into another slot's same positions, never
held twice by a second pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class PrefixStats:
    lookup_tokens: int  # prompt tokens of sequences placed so far
    hit_tokens: int  # of those, tokens taken from a slot instead of prefilled
    blocks: int  # blocks held in slots now (running and idle)
    idle_tokens: int  # tokens kept by idle slots
    evicted_blocks: int  # blocks dropped to stay within the budget or to give an idle slot to another prefix


@dataclass(frozen=True, slots=True)
class Placement:
    slot: int
    reused: int  # prompt tokens the slot holds once placed: prefill starts there
    source: int | None  # copy positions [0, reused) from this slot first (None: the slot holds them already)


class PrefixCache:
    """Bookkeeping only, on the engine thread: the batcher copies KV and runs prefill as a Placement says."""

    def __init__(self, slots: int, block: int, budget: int) -> None:
        self.block = block
        self.budget = budget
        self._holders: dict[bytes, dict[int, None]] = {}  # block name → slots holding it (ordered set)
        self._chains: list[list[bytes]] = [[] for _ in range(slots)]  # per slot: its registered blocks' names
        self._tokens: list[list[int]] = [[] for _ in range(slots)]  # per slot: the tokens its KV holds, in order
        self._namespaces: list[bytes] = [b""] * slots
        self._running: set[int] = set()
        self._idle: OrderedDict[int, None] = OrderedDict()  # idle slots with blocks, least recently used first
        self._lookup_tokens = 0
        self._hit_tokens = 0
        self._evicted = 0

    def stats(self) -> PrefixStats:
        return PrefixStats(
            self._lookup_tokens,
            self._hit_tokens,
            sum(len(names) for names in self._chains),
            sum(len(self._tokens[slot]) for slot in self._idle),
            self._evicted,
        )

    def held(self, slot: int) -> int:
        """Positions of `slot` whose KV is kept (a decode batch's spare rows must write past them)."""
        return len(self._tokens[slot])

    def free_slots(self) -> int:
        return len(self._chains) - len(self._running)

    def _longest(self, namespace: bytes, prompt: list[int]) -> tuple[int, int | None]:
        """(blocks, a slot holding them) for the longest chain of the prompt's blocks any slot holds; idle first."""
        found, holders = 0, None
        for name in chain(namespace, prompt, self.block):
            slots = self._holders.get(name)
            if not slots:
                break
            found, holders = found + 1, slots
        if holders is None:
            return 0, None
        idle = [slot for slot in self._idle if slot in holders]  # least recently used first
        return found, (idle[-1] if idle else next(iter(holders)))

    def place(self, namespace: bytes, prompt: list[int]) -> Placement | None:
        """A slot for a new sequence and the prompt tokens it already holds; None while every slot runs.

        The last prompt token is always run (its logits choose the first output token). An idle holder is
        taken over unless that would drop blocks of another prefix while an empty slot is free; a running
        holder is copied from."""
        if not self.free_slots():
            return None
        blocks, holder = self._longest(namespace, prompt) if self.budget > 0 else (0, None)
        matched = blocks * self.block
        if holder is not None:
            matched += _common_length(prompt[matched:], self._tokens[holder][matched:])  # into a partial block
        reused = max(0, min(matched, len(prompt) - 1))
        empty = [slot for slot in range(len(self._chains)) if slot not in self._running and slot not in self._idle]
        if holder is not None and holder not in self._running:
            loses_other_blocks = len(self._chains[holder]) > blocks
            if not (loses_other_blocks and empty):
                return self._claim(Placement(holder, reused, None), namespace)
        target = empty[0] if empty else next(iter(self._idle))  # else the least recently used idle slot
        if holder == target or reused == 0:
            return self._claim(Placement(target, reused if holder == target else 0, None), namespace)
        return self._claim(Placement(target, reused, holder), namespace)

    def _claim(self, placement: Placement, namespace: bytes) -> Placement:
        slot, reused, source = placement.slot, placement.reused, placement.source
        self._idle.pop(slot, None)
        kept = reused // self.block if source is None else 0
        self._evicted += max(0, len(self._chains[slot]) - kept)  # an idle slot's other blocks, given up
        if source is None:
            self._truncate(slot, reused)
        else:
            self._truncate(slot, 0)
            self._tokens[slot] = self._tokens[source][:reused]
            self._chains[slot] = self._chains[source][: reused // self.block]
            for name in self._chains[slot]:
                self._holders[name][slot] = None
        self._namespaces[slot] = namespace
        self._running.add(slot)
        return placement

    def count(self, prompt_tokens: int, reused: int) -> None:
        """A placed sequence's prompt: `reused` of its tokens were not run again."""
        self._lookup_tokens += prompt_tokens
        self._hit_tokens += reused

    def extend(self, slot: int, tokens: list[int]) -> None:
        """`tokens` were written into `slot` after what it held; register the blocks they complete."""
        held = self._tokens[slot]
        held.extend(tokens)
        names = self._chains[slot]
        done = len(names) * self.block
        if len(held) - done < self.block:
            return
        previous = names[-1] if names else None
        for name in chain(self._namespaces[slot], held[done:], self.block, previous):
            names.append(name)
            self._holders.setdefault(name, {})[slot] = None

    def release(self, slot: int) -> None:
        """The slot's sequence ended: its blocks stay findable, within the budget."""
        self._running.discard(slot)
        if self._tokens[slot]:
            self._idle[slot] = None
            self._idle.move_to_end(slot)
        self._fit_budget()

    def forget(self, slot: int) -> None:
        """The slot's KV cannot be trusted (a failed step): nothing of it is found again."""
        self._truncate(slot, 0)

    def _fit_budget(self) -> None:
        over = sum(len(self._tokens[slot]) for slot in self._idle) - self.budget
        while over > 0 and self._idle:
            slot = next(iter(self._idle))
            held = len(self._tokens[slot])
            keep = max(0, (held - over) // self.block * self.block)
            over -= held - keep
            self._evicted += len(self._chains[slot]) - keep // self.block
            self._truncate(slot, keep)

    def _truncate(self, slot: int, keep: int) -> None:
        """`slot` keeps its first `keep` tokens; blocks past them are no longer found there."""
        names = self._chains[slot]
        kept_blocks = keep // self.block
        for name in names[kept_blocks:]:
            holders = self._holders.get(name)
            if holders is not None:
                holders.pop(slot, None)
                if not holders:
                    del self._holders[name]
        del names[kept_blocks:]
        del self._tokens[slot][keep:]
        if not self._tokens[slot]:
            self._idle.pop(slot, None)


def _common_length(first: list[int], second: list[int]) -> int:
    """How many leading tokens the two lists share."""
    size = min(len(first), len(second))
    if size == 0:
        return 0
    differs = np.flatnonzero(np.asarray(first[:size]) != np.asarray(second[:size]))
    return int(differs[0]) if differs.size else size
