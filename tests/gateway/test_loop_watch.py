"""The event loop's lag watcher tells a stall the code caused from one the host's scheduler caused: a loop held
by a blocking call is late and not `descheduled`; a loop whose thread waited for a CPU is both."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from gateway.observability import loop_watch
from gateway.observability.metrics import Metrics


def _late(histogram) -> float:
    """Observations over 50 ms."""
    samples = {(s.name, s.labels.get("le")): s.value for metric in histogram.collect() for s in metric.samples}
    return samples[(histogram._name + "_count", None)] - samples[(histogram._name + "_bucket", "0.05")]


async def _watched(metrics: Metrics, hold) -> None:
    watcher = asyncio.ensure_future(loop_watch._watch(metrics))
    await asyncio.sleep(0.05)
    await hold()
    await asyncio.sleep(0.05)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)


def test_a_loop_held_by_a_blocking_call_is_late_and_not_descheduled():
    metrics = Metrics()

    async def block() -> None:
        time.sleep(0.2)  # the code's own stall: the thread sleeps, it does not wait for a CPU

    asyncio.run(_watched(metrics, block))
    assert _late(metrics.loop_lag) >= 1
    assert _late(metrics.loop_lag_descheduled) == 0


CHILD = """
import asyncio, os, sys, time
sys.path[:0] = [{tests!r}]
from test_loop_watch import _late, _watched
from gateway.observability.metrics import Metrics
metrics = Metrics()
cpus = os.sched_getaffinity(0)
os.sched_setaffinity(0, {{{cpu}}})  # loaded: from here on it runs beside the busy processes
os.nice(19)

async def wait_for_a_late_timer():
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _late(metrics.loop_lag_descheduled) < 1:
        await asyncio.sleep(0.001)

asyncio.run(_watched(metrics, wait_for_a_late_timer))
os.sched_setaffinity(0, cpus)  # the other CPUs again, to end in good time
print(_late(metrics.loop_lag), _late(metrics.loop_lag_descheduled))
"""


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="the kernel keeps no schedstat")
def test_a_loop_whose_thread_waits_for_a_cpu_is_late_and_descheduled():
    """A loop at nice 19 pinned to one CPU beside three busy processes there: its timers run late, its thread
    waiting for the CPU."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
    try:
        child = CHILD.format(tests=os.path.dirname(__file__), cpu=cpu)
        answer = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert answer.returncode == 0, answer.stderr
    late, descheduled = map(float, answer.stdout.split())
    assert descheduled >= 1 and late >= descheduled
