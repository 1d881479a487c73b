"""A ResponseStore wrapper that times every operation and counts the failed ones (for the metrics)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from state import ResponseStore, StoredCot, StoredResponse, StoreUnavailable

from .metrics import Metrics
from .tracing import child_span

T = TypeVar("T")


class TimedStore:
    def __init__(self, store: ResponseStore, metrics: Metrics) -> None:
        self.inner = store
        self._metrics = metrics

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            with child_span(f"store.{operation}", {"db.operation.name": operation}):
                return await call
        except StoreUnavailable:
            self._metrics.store_errors.labels(operation).inc()
            raise
        finally:
            self._metrics.child(self._metrics.store_seconds, operation).observe(time.perf_counter() - started)

    async def save(self, record: StoredResponse, lease_s: float | None = None) -> bool:
        return await self._timed("save", self.inner.save(record, lease_s))

    async def renew(self, tenant: str, response_id: str, lease_s: float) -> bool:
        return await self._timed("renew", self.inner.renew(tenant, response_id, lease_s))

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._timed("load", self.inner.load(tenant, response_id))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._timed("delete", self.inner.delete(tenant, response_id))

    async def index_tool_calls(self, entries: list[StoredCot], response_id: str | None = None) -> bool:
        return await self._timed("index_tool_calls", self.inner.index_tool_calls(entries, response_id))

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None:
        return await self._timed("find_cot", self.inner.find_cot(tenant, call_id))

    async def health(self) -> str | None:
        problem = await self._timed("health", self.inner.health())
        if problem is not None:
            self._metrics.store_errors.labels("health").inc()
        return problem

    async def aclose(self) -> None:
        await self.inner.aclose()
