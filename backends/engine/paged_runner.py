"""The decoder runtime driven sequence by sequence, without the batcher, as the tests and benches drive it: each
sequence gets its own pages from the pools (shared only when asked), and `prefill`/`decode` return logits on
the host."""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .page_pool import KvPools, PageTable
from .runtime import DecoderRuntime, StepRows


class PagedRunner:
    def __init__(self, runtime: DecoderRuntime, pools: KvPools, trim: bool = False) -> None:
        self.runtime = runtime
        self.pools = pools
        self.trim = trim
        self.tables: dict[int, PageTable] = {}

    @classmethod
    def create(
        cls,
        model: str,
        config: ModelConfig,
        sequences: int,
        max_positions: int,
        page_size: int = 32,
        full_pages: int | None = None,
        window_pages: int | None = None,
        **options,
    ) -> PagedRunner:
        """A runtime whose pools hold `sequences` sequences of `max_positions` unless `full_pages` says otherwise;
        the window pool as large as the full one (nothing given back), or of `window_pages`, each sequence's window
        pages behind it then given back as it moves on. `options`: the DecoderRuntime's."""
        pages = full_pages or sequences * -(-max_positions // page_size) + 1
        pools = KvPools(pages, window_pages or pages, page_size, config.sliding_window)
        windows = pools.window.pages
        runtime = DecoderRuntime(model, config, sequences, max_positions, pages, windows, page_size, **options)
        return cls(runtime, pools, trim=window_pages is not None)

    def _table(self, sequence: int, start: int, end: int) -> PageTable:
        table = self.tables.setdefault(sequence, PageTable())
        if start == 0 and table.full:  # a restart: the sequence's pages are written again
            self.pools.release(table, lambda page: False, lambda page: False)
        if self.trim:
            self.pools.trim(table, start, lambda page: False)
        self.pools.extend(table, start, end)
        return table

    def share_prefix(self, source: int, target: int, positions: int) -> None:
        """`target` starts as `source`'s first `positions`: its full pages by reference, a copy of the page they
        end in (copy-on-write), as the prefix cache hands them out."""
        shared, size = self.tables[source], self.pools.page_size
        table = self.tables.setdefault(target, PageTable())
        whole = positions // size
        for page in shared.full[:whole]:
            self.pools.full.retain(page)
        for page in shared.window[:whole]:
            self.pools.window.retain(page)
        table.full, table.window = shared.full[:whole], shared.window[:whole]
        if positions % size:
            self.pools.extend(table, whole * size, whole * size + 1)
            self.runtime.copy_page("full", shared.full[whole], table.full[whole], positions % size)
            self.runtime.copy_page("window", shared.window[whole], table.window[whole], positions % size)

    def run(self, rows: list[tuple[int, list[int], int]]) -> None:
        """(sequence, tokens, start) rows in one step: logits row i is then row i's next token's."""
        step = StepRows()
        for sequence, tokens, start in rows:
            step.add(tokens, start, self._table(sequence, start, start + len(tokens)))
        self.runtime.run(step)

    def fill(self, sequence: int, tokens: list[int], start: int = 0) -> None:
        """Run `tokens` into the sequence from `start` (0 restarts it); logits row 0 is then its next token's."""
        self.run([(sequence, tokens, start)])

    def prefill(self, sequence: int, tokens: list[int], start: int = 0) -> np.ndarray:
        """`fill`, then the next-token logits on the host."""
        self.fill(sequence, tokens, start)
        return self.runtime.logits([0])[0]

    def step(self, rows: list[tuple[int, int, int]]) -> None:
        """(sequence, token, position) rows, one token each: logits row i is then row i's next token's."""
        self.run([(sequence, [token], position) for sequence, token, position in rows])

    def decode(self, rows: list[tuple[int, int, int]]) -> dict[int, np.ndarray]:
        """`step`, then each sequence's next-token logits on the host."""
        self.step(rows)
        logits = self.runtime.logits(list(range(len(rows))))
        return {sequence: logits[index] for index, (sequence, _, _) in enumerate(rows)}
