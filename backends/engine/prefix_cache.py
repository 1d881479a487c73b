"""Which KV pages hold which token prefix, so that a new sequence prefills only what no page already holds.

A view over the page pools (page_pool.py): a full page is named by a hash chain, the hash of the cache's
namespace (tenant, and `prompt_cache_key` when given), the previous page's name and the page's tokens, so
equal names mean equal tokens from position 0 on, in the same namespace. A sequence names each page once it
is full (prompt chunks, then every generated token fed back), with its window-layer page beside it; a new
sequence takes the longest chain of its prompt's pages by reference, running holders and cached pages alike,
as long as the window layers' pages its first token reads are still kept. A finished sequence's last,
partly filled page is kept too (a tail): a later prompt that continues the chain into it gets a copy of the
positions they share (copy-on-write: a shared page is never written).

Pages nobody holds stay cached while the pools have room, least recently used out first, and at most
`budget` tokens' worth of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from backends.page_names import LazyChain, chain

from .page_events import PageEvents
from .page_pool import SCRATCH, KvPools, PageTable


@dataclass(frozen=True, slots=True)
class PrefixStats:
    lookup_tokens: int  # prompt tokens of sequences placed so far
    hit_tokens: int  # of those, tokens taken from cached pages instead of prefilled
    blocks: int  # named full pages now (held or cached)
    evicted_blocks: int  # named pages taken back for other sequences or to stay within the budget


@dataclass(slots=True)
class Block:
    full: int
    window: int  # SCRATCH once the window page was taken back


@dataclass(slots=True)
class Tail:
    """A finished sequence's last, partly filled page pair and the tokens it holds."""

    full: int
    window: int
    tokens: list[int]


@dataclass(slots=True)
class Written:
    """What a sequence has written: its tokens and the names of its full pages."""

    tokens: list[int] = field(default_factory=list)
    names: list[bytes] = field(default_factory=list)


class PrefixCache:
    """Bookkeeping only, on the engine thread: the batcher copies KV as a lookup says."""

    def __init__(self, pools: KvPools, budget: int, enabled: bool = True, events: PageEvents | None = None) -> None:
        """`events`: where the names given and dropped are reported (for routers), if anywhere."""
        self.pools = pools
        self.events = events
        self.block = pools.page_size
        self.enabled = enabled and budget > 0
        self.budget_pages = budget // self.block
        self._blocks: dict[bytes, Block] = {}
        self._full_names: dict[int, bytes] = {}
        self._window_names: dict[int, bytes] = {}
        self._tails: dict[bytes, dict[int, Tail]] = {}  # parent name → tails by full page
        self._children: dict[bytes, dict[int, list[int]]] = {}  # parent name → its named children's tokens by page
        self._parents: dict[int, bytes] = {}  # named full page → its parent's name
        self._tail_full: dict[int, tuple[bytes, Tail]] = {}
        self._tail_window: dict[int, tuple[bytes, Tail]] = {}
        self._lookup_tokens = 0
        self._hit_tokens = 0
        self._evicted = 0
        # pages made findable so far (named, a window page kept again, a tail kept): a lookup finds more only after
        # this grew
        self.findable_added = 0
        pools.full.on_evict = self._evict_full
        pools.window.on_evict = self._evict_window

    def stats(self) -> PrefixStats:
        return PrefixStats(self._lookup_tokens, self._hit_tokens, len(self._blocks), self._evicted)

    def named_full(self, page: int) -> bool:
        return page in self._full_names or page in self._tail_full

    def named_window(self, page: int) -> bool:
        return page in self._window_names or page in self._tail_window

    # lookups

    def lookup(
        self, namespace: bytes, prompt: list[int], names: Iterable[bytes] | None = None
    ) -> tuple[list[Block], Tail | None, int]:
        """(the pages of the prompt's longest kept prefix, a tail to copy from or None, prompt tokens reused);
        `names`: the prompt's page names (`page_names`), where a caller looks up the same prompt more than once.

        The last prompt token is always run (its logits choose the first output token)."""
        if not self.enabled:
            return [], None, 0
        limit = len(prompt) - 1
        found: list[tuple[bytes, Block]] = []
        for name in names if names is not None else self.page_names(namespace, prompt):
            block = self._blocks.get(name)
            if block is None:
                break
            found.append((name, block))
        count = len(found)
        while count > 0 and not self._window_kept([b for _, b in found[:count]], count * self.block):
            count -= 1
        blocks = [block for _, block in found[:count]]
        reused = count * self.block
        parent = found[count - 1][0] if count else namespace
        tail, copied = self._tail_for(parent, prompt[reused:limit])
        return blocks, tail, reused + copied

    def holds_page(self, names: LazyChain, index: int) -> bool:
        """Whether the page a lookup reads at `index` of a prompt's names (`page_names`) is named here."""
        name = names.at(index)
        return name is not None and name in self._blocks

    def page_names(self, namespace: bytes, prompt: list[int]) -> LazyChain:
        """The names a lookup of `prompt` reads (all its full pages but one holding its last token), each hashed
        once, when first read."""
        limit = len(prompt) - 1
        return LazyChain(chain(namespace, prompt[: limit // self.block * self.block], self.block))

    def _window_kept(self, blocks: list[Block], position: int) -> bool:
        """Whether the window pages that the token at `position` reads among `blocks` are all kept."""
        first = self.pools.first_window_page(position)
        return all(block.window != SCRATCH for block in blocks[first:])

    def _tail_for(self, parent: bytes, rest: list[int]) -> tuple[Tail | None, int]:
        """The page after `parent` (a finished sequence's tail, or a named page of another continuation, running
        or cached) sharing the most leading tokens with `rest`, and how many it shares."""
        best, shared = None, 0
        for tail in self._tails.get(parent, {}).values():
            common = _common_length(tail.tokens, rest)
            if common > shared:
                best, shared = tail, common
        for page, tokens in self._children.get(parent, {}).items():
            common = _common_length(tokens, rest)
            block = self._blocks[self._full_names[page]]
            if common > shared and block.window != SCRATCH:
                best, shared = Tail(block.full, block.window, tokens), common
        return best, shared

    def count(self, prompt_tokens: int, reused: int) -> None:
        """A placed sequence's prompt: `reused` of its tokens were not run again."""
        self._lookup_tokens += prompt_tokens
        self._hit_tokens += reused

    def take(self, blocks: list[Block], reused: int, table: PageTable, written: Written, prompt: list[int]) -> None:
        """Hold `blocks` in `table` for a sequence that starts at `reused` (its window pages from where its
        first token reads), and name them as its own."""
        pools = self.pools
        first = pools.first_window_page(reused)
        for index, block in enumerate(blocks):
            pools.full.retain(block.full)
            table.full.append(block.full)
            if index >= first:
                pools.window.retain(block.window)
                table.window.append(block.window)
            else:
                table.window.append(SCRATCH)
        written.tokens = list(prompt[: len(blocks) * self.block])
        written.names = [self._full_names[block.full] for block in blocks]

    # naming

    def extend(self, namespace: bytes, table: PageTable, written: Written, tokens: list[int]) -> None:
        """`tokens` were written after what the sequence held; name the pages they fill."""
        written.tokens.extend(tokens)
        if not self.enabled:
            return
        done = len(written.names)
        if len(written.tokens) - done * self.block < self.block:
            return
        previous = written.names[-1] if written.names else namespace
        for name in chain(namespace, written.tokens[done * self.block :], self.block, previous):
            page = len(written.names)
            written.names.append(name)
            tokens = written.tokens[page * self.block : (page + 1) * self.block]
            self._name(name, previous, tokens, table.full[page], table.window[page])
            previous = name

    def _name(self, name: bytes, parent: bytes, tokens: list[int], full: int, window: int) -> None:
        block = self._blocks.get(name)
        if block is None:
            self.findable_added += 1
            self._blocks[name] = Block(full, window)
            self._full_names[full] = name
            self._children.setdefault(parent, {})[full] = tokens
            self._parents[full] = parent
            if window != SCRATCH:
                self._window_names[window] = name
            if self.events is not None:
                self.events.stored(name, parent)
        elif block.window == SCRATCH and window != SCRATCH and window not in self._window_names:
            block.window = window  # the same tokens at the same positions: the same KV
            self._window_names[window] = name
            self.findable_added += 1

    def keep_tail(self, namespace: bytes, table: PageTable, written: Written) -> None:
        """A finished sequence's partly filled last page stays findable (before its pages are released)."""
        count = len(written.tokens) - len(written.names) * self.block
        page = len(written.names)
        if not self.enabled or count <= 0 or page >= len(table.full) or table.window[page] == SCRATCH:
            return
        full, window = table.full[page], table.window[page]
        if full in self._full_names or full in self._tail_full:
            return
        parent = written.names[-1] if written.names else namespace
        tail = Tail(full, window, written.tokens[page * self.block :])
        self._tails.setdefault(parent, {})[full] = tail
        self.findable_added += 1
        self._tail_full[full] = (parent, tail)
        self._tail_window[window] = (parent, tail)

    def forget(self, table: PageTable) -> None:
        """The pages' KV cannot be trusted (a failed step): nothing of them is found again."""
        for page in table.full:
            if page in self._full_names:
                self._unname(page)
        for page in table.window:
            name = self._window_names.pop(page, None)
            if name is not None and name in self._blocks:
                self._blocks[name].window = SCRATCH

    def fit_budget(self) -> None:
        """Cached pages beyond the budget are freed, least recently used first."""
        while self.pools.full.stats().cached > self.budget_pages and self.pools.full.evict_oldest():
            pass
        while self.pools.window.stats().cached > self.budget_pages and self.pools.window.evict_oldest():
            pass

    # eviction (called by the pools as they take a cached page back)

    def _unname(self, page: int) -> Block:
        """Page `page` is named no more (nor is its window page); the block it was."""
        name = self._full_names.pop(page)
        block = self._blocks.pop(name)
        if self.events is not None:
            self.events.removed(name)
        self._window_names.pop(block.window, None)
        parent = self._parents.pop(page)
        children = self._children[parent]
        del children[page]
        if not children:
            del self._children[parent]
        return block

    def _evict_full(self, page: int) -> None:
        if page in self._full_names:
            self._evicted += 1
            block = self._unname(page)
            if block.window != SCRATCH:
                self.pools.window.drop(block.window)
        entry = self._tail_full.pop(page, None)
        if entry is not None:
            self._drop_tail(*entry)
            if self._tail_window.pop(entry[1].window, None) is not None:
                self.pools.window.drop(entry[1].window)

    def _evict_window(self, page: int) -> None:
        name = self._window_names.pop(page, None)
        if name is not None and name in self._blocks:
            self._blocks[name].window = SCRATCH
        entry = self._tail_window.pop(page, None)
        if entry is not None:
            self._drop_tail(*entry)
            if self._tail_full.pop(entry[1].full, None) is not None:
                self.pools.full.drop(entry[1].full)

    def _drop_tail(self, parent: bytes, tail: Tail) -> None:
        tails = self._tails.get(parent, {})
        tails.pop(tail.full, None)
        if not tails:
            self._tails.pop(parent, None)


def _common_length(first: list[int], second: list[int]) -> int:
    """How many leading tokens the two lists share."""
    size = min(len(first), len(second))
    if size == 0:
        return 0
    differs = np.flatnonzero(np.asarray(first[:size]) != np.asarray(second[:size]))
    return int(differs[0]) if differs.size else size
