"""A gateway process's event-loop budget, read from its own `gateway_event_loop_lag_seconds`: how many times a
timer ran more than LOOP_BUDGET_S late, and checks that an action (or a whole test) made no such stall."""

from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
LOOP_BUDGET_S = 0.05


def loop_stalls(url: str) -> float:
    """How many times the gateway's event loop ran a timer more than LOOP_BUDGET_S late, so far, but for those
    the host's scheduler caused (the loop's thread waited for a CPU most of the late time)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line.startswith("gateway_event_loop")}

    def late(series: str) -> float:
        return samples[f"{series}_count"] - samples[f'{series}_bucket{{le="{LOOP_BUDGET_S}"}}']

    return late("gateway_event_loop_lag_seconds") - late("gateway_event_loop_lag_descheduled_seconds")


class LoopBudget:
    """One gateway's budget over a test module (its /metrics must be public)."""

    def __init__(self) -> None:
        self.excused = 0.0  # stalls of a first attempt that the second made without one (see `within`)

    @contextlib.contextmanager
    def held(self, url: str) -> Iterator[None]:
        """Nothing in the block stalls the loop, but what `within` excused."""
        before, excused = loop_stalls(url), self.excused
        yield
        time.sleep(0.05)  # the watcher's last sample
        stalls = loop_stalls(url) - before - (self.excused - excused)
        assert stalls == 0, "the event loop ran a timer more than 50 ms late"

    def within(self, url: str, action: Callable[[], T]) -> T:
        """What `action` returned, the loop held within its budget meanwhile. A heavy input (seconds of CPU on 2
        CPUs beside the test) is tried again after a stall, and must then make none: a stall the code causes
        happens every time, one the host's scheduler causes does not."""
        for attempt in range(2):
            before = loop_stalls(url)
            result = action()
            time.sleep(0.05)
            stalls = loop_stalls(url) - before
            if not stalls:
                return result
            if attempt == 0:
                self.excused += stalls
        raise AssertionError("the event loop ran a timer more than 50 ms late, on both attempts")
