"""The gateway's own API on a private Unix socket: how the batch runner sends a batch's line as its tenant.

The socket lives in a directory only this process's user can enter (0700), and the app behind it serves only the
two batch endpoints through the same middleware and handlers as the public port, so a line is checked, limited,
billed and traced as the tenant's own request would be. Its requests name their tenant in a header that only
this app believes, and run at the `flex` service tier.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from ..services import Services, attach
from ..tenants.auth import LOOPBACK, LOOPBACK_KEY_HEADER, LOOPBACK_LINE_HEADER, LOOPBACK_TENANT_HEADER

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Loopback:
    def __init__(self, services: Services, middleware: Any, routes: dict[str, Handler]) -> None:
        self._app = web.Application(
            client_max_size=services.settings.max_body_bytes,
            middlewares=[middleware],
            handler_args={"auto_decompress": False},
        )
        attach(self._app, services)
        self._app[LOOPBACK] = True
        for path, handler in routes.items():
            self._app.router.add_post(path, handler)
        self._runner: web.AppRunner | None = None
        self._directory: str | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="gateway-batch-")
        os.chmod(self._directory, 0o700)
        path = os.path.join(self._directory, "api.sock")
        self._runner = web.AppRunner(self._app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, path).start()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=path, limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )

    async def post(
        self, tenant: str, key_id: str | None, line: str, path: str, body: dict[str, Any], timeout_s: float
    ) -> tuple[int, str, Any]:
        """(status, request id, JSON body) of the request as `tenant` made it; `line` ("batch_id/custom_id")
        is what the ledger bills once."""
        assert self._session is not None, "the loopback is not started"
        headers = {LOOPBACK_TENANT_HEADER: tenant, LOOPBACK_KEY_HEADER: key_id or "", LOOPBACK_LINE_HEADER: line}
        async with self._session.post(
            f"http://gateway{path}", json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            answer = await response.json(content_type=None)
            return response.status, response.headers.get("X-Request-ID", ""), answer

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
