"""An aiohttp application served on 127.0.0.1 by a private event loop in a thread: the one way the tests run
an in-process server (a live gateway, fake model servers, fake search and web sites)."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web
from redis_servers import free_port


class ThreadedServer:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, coroutine: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def serve(self, make_app: Callable[[], web.Application], **runner_options: Any) -> None:
        """Start the loop, build the app on it (`make_app` runs there) and listen."""
        self._thread.start()

        async def boot() -> None:
            self._runner = web.AppRunner(make_app(), **runner_options)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        self.call(boot())

    def close(self, timeout: float = 30) -> None:
        """Clean the app up and stop the loop. A cleanup still running after `timeout` fails the test, with the
        stacks of the tasks it left, once they are cancelled and the loop stopped: nothing of this server goes on
        serving (or claiming work from a shared store) into the tests after it."""
        stuck = ""
        if self._runner is not None:
            try:
                self.call(self._runner.cleanup(), timeout)
            except TimeoutError:
                stuck = self.call(_cancel_every_task(), 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        assert not stuck, f"the server's cleanup did not end in {timeout} s; its tasks then:\n{stuck}"


async def _cancel_every_task() -> str:
    """Every other task's stack, then each cancelled."""
    stacks = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.print_stack(limit=12, file=stacks)
            task.cancel()
    return stacks.getvalue()
