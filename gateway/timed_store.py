"""A ResponseStore wrapper that times every operation and counts the failed ones (for the metrics)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from state import ResponseStore, StoredCot, StoredResponse, StoreUnavailable

from .metrics import Metrics

T = TypeVar("T")


class TimedStore:
    def __init__(self, store: ResponseStore, metrics: Metrics) -> None:
        self.inner = store
        self._metrics = metrics

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await call
        except StoreUnavailable:
            self._metrics.store_errors.labels(operation).inc()
            raise
        finally:
            self._metrics.store_seconds.labels(operation).observe(time.perf_counter() - started)

    async def save(self, record: StoredResponse) -> None:
        await self._timed("save", self.inner.save(record))

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._timed("load", self.inner.load(tenant, response_id))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._timed("delete", self.inner.delete(tenant, response_id))

    async def index_tool_calls(self, entries: list[StoredCot]) -> None:
        await self._timed("index_tool_calls", self.inner.index_tool_calls(entries))

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None:
        return await self._timed("find_cot", self.inner.find_cot(tenant, call_id))

    async def ping(self) -> bool:
        reachable = await self._timed("ping", self.inner.ping())
        if not reachable:
            self._metrics.store_errors.labels("ping").inc()
        return reachable

    async def aclose(self) -> None:
        await self.inner.aclose()
