"""What the host spends around the device's work, counted by the runtime and the scheduler as the engine serves.

A decode step's time is the device's work plus everything the host does around it: the scheduler's choice of
rows, the step's inputs (token ids, positions, page tables, sampling rows) made and copied in, each session run
launched, and each wait for the device's results (on a GPU a sync, which stops the host from preparing the next
step while the device runs). The counts here are taken on every path, so a regression of the host's share shows on
the CPU before a GPU does (bench/engine_check.py's `host` step reports them per decode step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class HostCosts:
    loops: int = 0  # scheduler iterations that ran a step
    loop_s: float = 0.0  # their wall time: admission, the step's rows, the runs, the bookkeeping after
    runs: int = 0  # sessions run (the decoder's graph, the sampler's): each a launch of a whole graph
    run_s: float = 0.0  # time inside those runs (the device's work, on a GPU until its results are synchronized)
    syncs: int = 0  # waits of the host for the device's results (read back or synchronized)
    input_bytes: int = 0  # bytes of host inputs given to the runs

    @contextlib.contextmanager
    def run(self, inputs: Iterable[np.ndarray]) -> Iterator[None]:
        """Counts the session run the block makes, given these host inputs."""
        started = time.perf_counter()
        yield
        self.runs += 1
        self.run_s += time.perf_counter() - started
        self.input_bytes += sum(value.nbytes for value in inputs)

    def copy(self) -> HostCosts:
        return dataclasses.replace(self)

    def per_loop(self, before: HostCosts) -> dict[str, float]:
        """The figures per scheduler iteration since `before` (a copy taken earlier)."""
        loops = max(self.loops - before.loops, 1)
        loop_s, run_s = self.loop_s - before.loop_s, self.run_s - before.run_s
        return {
            "loops": self.loops - before.loops,
            "loop_ms": round(loop_s / loops * 1e3, 4),
            "host_ms": round((loop_s - run_s) / loops * 1e3, 4),
            "host_share": round((loop_s - run_s) / loop_s, 4) if loop_s > 0 else 0.0,
            "runs": round((self.runs - before.runs) / loops, 3),
            "syncs": round((self.syncs - before.syncs) / loops, 3),
            "input_bytes": round((self.input_bytes - before.input_bytes) / loops),
        }
