"""The engine's batcher run iteration by iteration, with no engine thread and no timing: schedules replayed
exactly (arrivals at set iterations, clients going away after set token counts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.base import Chunk, GenerateRequest
from backends.engine.backend import EngineOptions
from backends.engine.batcher import Batcher, Sequence
from backends.engine.checkpoint import Checkpoint
from backends.engine.graph import GraphOptions
from backends.engine.kernels.build import kernel_library
from backends.engine.model_cache import compiled_model, default_cache_dir
from backends.engine.page_pool import KvPools
from backends.engine.runtime import DecoderRuntime


@dataclass
class Arrival:
    at: int  # the iteration it is submitted at
    request: GenerateRequest
    cancel_after: int | None = None  # tokens after which its client goes away
    tokens: list[int] = field(default_factory=list)  # what it was answered
    cached: int | None = None  # once it ended: the prompt tokens the engine reused (its `cached_tokens`)


def replay(batcher: Batcher, arrivals: list[Arrival], iterations: int = 1000) -> dict[int, str]:
    """Run the batcher's iterations by hand, submitting each arrival at its iteration: how each request ended
    ("done", "cancelled", or its failure's text), once all have or the iterations ran out."""
    ended: dict[int, str] = {}
    sequences: dict[int, Sequence] = {}

    def emit(index: int) -> Callable[[Chunk | BaseException | None], None]:
        arrival = arrivals[index]

        def take(item: Chunk | BaseException | None) -> None:
            if isinstance(item, Chunk):
                arrival.tokens += item.tokens
                after = arrival.cancel_after
                if after is not None and len(arrival.tokens) >= after and index not in ended:
                    sequences[index].cancelled.set()
                    ended[index] = "cancelled"
            elif index not in ended:
                ended[index] = "done" if item is None else str(item)
                arrival.cached = sequences[index].reused

        return take

    arriving = {arrival.at for arrival in arrivals}
    for iteration in range(iterations):
        for index, arrival in enumerate(arrivals):
            if arrival.at == iteration:
                sequences[index] = Sequence(arrival.request, emit(index), np.random.default_rng(index))
                batcher.submit(sequences[index])
        busy = batcher.active or batcher.load().waiting
        if iteration > max(arriving) and len(ended) == len(arrivals) and not busy:
            break
        if busy or iteration in arriving:
            assert batcher.serve_once()  # with nothing to do, an iteration would wait for an arrival
    return ended


def replaying_batcher(checkpoint: Path, options: EngineOptions) -> Batcher:
    """A batcher with no engine thread over `checkpoint` on the CPU, its graph, runtime and pools sized as the engine
    sizes them for `options`."""
    opened = Checkpoint(checkpoint)
    config, page = opened.config, options.page_size
    graph = GraphOptions(options.max_positions, page_size=page)
    model = compiled_model(opened, graph, Path(options.cache_dir) if options.cache_dir else default_cache_dir())
    full, window = options.full_pages(), options.window_pages(config.sliding_window)
    runtime = DecoderRuntime(
        str(model), config, options.max_batch + 1, options.max_positions, full, window, page, kernels=kernel_library()
    )
    pools = KvPools(full, window, page, config.sliding_window)
    return Batcher(runtime, pools, options.max_batch, options.prefill_chunk, options.prefix_budget(), thread=False)
