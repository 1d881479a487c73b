"""How long a gateway's /healthz takes while something else runs: a blocked event loop shows here first."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def slowest_healthz_during(url: str, action: Callable[[], T]) -> tuple[T, float]:
    """(what `action` returned, the slowest /healthz answer in seconds while it ran)."""
    slowest = [0.0]
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.monotonic()
            urllib.request.urlopen(url + "/healthz", timeout=30).read()
            slowest[0] = max(slowest[0], time.monotonic() - started)
            time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        return action(), slowest[0]
    finally:
        done.set()
        prober.join()
