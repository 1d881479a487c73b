"""Which event loop serves: uvloop (libuv, in C) where it is installed, unless GATEWAY_EVENT_LOOP says `asyncio`;
`uvloop` insists on it. `bench/event_loop_bench.py` measures the two against each other in one run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

EventLoopSetting = Literal["auto", "uvloop", "asyncio"]
T = TypeVar("T")


def loop_factory(setting: EventLoopSetting) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for `setting` (None: asyncio's own); `uvloop` where it cannot be imported is an error."""
    if setting == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if setting == "uvloop":
            raise ValueError("GATEWAY_EVENT_LOOP=uvloop, but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], setting: EventLoopSetting) -> T:
    """asyncio.run on the loop `setting` picks."""
    with asyncio.Runner(loop_factory=loop_factory(setting)) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`, for the running loop."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
