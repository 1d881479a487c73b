"""The KV cache's pages: which are free, which sequences hold which, and which the prefix cache keeps.

The engine keeps two pools, each of fixed-size pages (`page_size` positions of every layer of its kind):
one for the full-attention layers and one for the sliding-window layers. A sequence's `PageTable` maps
each of its logical pages (positions [p x page_size, (p + 1) x page_size)) to a physical page of each
pool; on window layers only the pages its window still reaches are held (a ring: the others are given
back as the sequence moves on, and read as page 0 if at all, which no attention sees).

A page is held by reference: any number of sequences may share a page of a common prefix (a page is
written only while it is its writer's last, partly filled page, and shared only once full or copied).
A page nobody holds is free, or cached when the prefix cache still names it (prefix_cache.py): cached
pages are taken back least recently used first when free ones run out. Page 0 of each pool is scratch,
never handed out: padding rows of a batch write there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

SCRATCH = 0


@dataclass(frozen=True, slots=True)
class PoolStats:
    pages: int  # pages that can be handed out (scratch excluded)
    in_use: int  # held by running sequences
    cached: int  # held by no sequence, still named by the prefix cache
    free: int


class PagePool:
    """Reference counts over `pages` pages, with an LRU of the cached ones."""

    def __init__(self, pages: int) -> None:
        if pages < 2:
            raise ValueError("a page pool needs at least one page besides the scratch page")
        self.pages = pages
        self._refs = [0] * pages
        self._free = list(range(pages - 1, SCRATCH, -1))  # popped from the end: low pages first
        self._cached: OrderedDict[int, None] = OrderedDict()
        self.on_evict: Callable[[int], None] = lambda page: None  # the prefix cache forgets the page

    def available(self) -> int:
        """Pages a caller can get now: free ones and cached ones (taken back)."""
        return len(self._free) + len(self._cached)

    def cached(self, page: int) -> bool:
        return page in self._cached

    def allocate(self) -> int:
        """A page held once by the caller; the caller checked `available` first."""
        if self._free:
            page = self._free.pop()
        else:
            page, _ = self._cached.popitem(last=False)
            self.on_evict(page)
        self._refs[page] = 1
        return page

    def retain(self, page: int) -> None:
        """One more holder of a held or cached page."""
        self._cached.pop(page, None)
        self._refs[page] += 1

    def release(self, page: int, named: bool) -> None:
        """One holder fewer; a page no one holds is cached if the prefix cache names it, else free."""
        if page == SCRATCH:
            return
        self._refs[page] -= 1
        if self._refs[page] == 0:
            if named:
                self._cached[page] = None
            else:
                self._free.append(page)

    def drop(self, page: int) -> None:
        """A cached page the prefix cache no longer names becomes free."""
        if self._cached.pop(page, "absent") is None:
            self._free.append(page)

    def evict_oldest(self) -> bool:
        """Free the least recently cached page; False when none is cached."""
        if not self._cached:
            return False
        page, _ = self._cached.popitem(last=False)
        self.on_evict(page)
        self._free.append(page)
        return True

    def stats(self) -> PoolStats:
        cached, free = len(self._cached), len(self._free)
        return PoolStats(self.pages - 1, self.pages - 1 - cached - free, cached, free)


@dataclass(slots=True)
class PageTable:
    """One sequence's pages, by logical page: `full[p]` and `window[p]` (SCRATCH where the ring gave it back)."""

    full: list[int] = field(default_factory=list)
    window: list[int] = field(default_factory=list)


class KvPools:
    """The two pools and what a sequence's positions need of them."""

    def __init__(self, full_pages: int, window_pages: int, page_size: int, window: int) -> None:
        self.full = PagePool(full_pages)
        self.window = PagePool(window_pages)
        self.page_size = page_size
        self.window_size = window

    def first_window_page(self, position: int) -> int:
        """The first logical page that the token at `position` reads on window layers."""
        return max(0, position - self.window_size + 1) // self.page_size

    def needed(self, table: PageTable, start: int, end: int) -> tuple[int, int]:
        """(full, window) pages to allocate for positions [start, end) to be written and attended."""
        last = (end - 1) // self.page_size
        full = max(0, last + 1 - len(table.full))
        first = self.first_window_page(start)
        window = sum(1 for p in range(first, last + 1) if p >= len(table.window) or table.window[p] == SCRATCH)
        return full, window

    def fits(self, needs: tuple[int, int]) -> bool:
        return needs[0] <= self.full.available() and needs[1] <= self.window.available()

    def extend(self, table: PageTable, start: int, end: int) -> None:
        """Allocate what positions [start, end) need (the caller checked `fits`)."""
        last = (end - 1) // self.page_size
        while len(table.full) <= last:
            table.full.append(self.full.allocate())
        while len(table.window) <= last:
            table.window.append(SCRATCH)
        for p in range(self.first_window_page(start), last + 1):
            if table.window[p] == SCRATCH:
                table.window[p] = self.window.allocate()

    def trim(self, table: PageTable, position: int, named: Callable[[int], bool]) -> None:
        """Give back the window pages that the token at `position` and later ones no longer read."""
        for p in range(min(self.first_window_page(position), len(table.window))):
            page = table.window[p]
            if page != SCRATCH:
                self.window.release(page, named(page))
                table.window[p] = SCRATCH

    def release(self, table: PageTable, named_full: Callable[[int], bool], named_window: Callable[[int], bool]) -> None:
        """Give back every page of `table` (which is emptied)."""
        for page in table.full:
            self.full.release(page, named_full(page))
        for page in table.window:
            self.window.release(page, named_window(page))
        table.full.clear()
        table.window.clear()
