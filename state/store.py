"""The ResponseStore protocol shared by the in-memory and Redis stores, and a record's lifecycle.

A response being generated is saved with a lease (`save(record, lease_s=...)`) that its owner renews
while it runs. A running record whose lease ran out (its replica stopped) reads as failed for every
reader. The final save ends the lease. DELETE is final: it leaves a tombstone that later saves and
CoT indexing respect, and removes the CoT indexed under the response's tool calls.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .records import StoredCot, StoredResponse

DEFAULT_TTL_S = 30 * 24 * 3600  # OpenAI keeps stored responses for 30 days
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
DEFAULT_LEASE_S = 30.0


class StoreUnavailable(RuntimeError):
    """The backing store cannot do this now; callers answer 503 or say `store: false`, never lose data silently."""

    def __init__(self, message: str, reason: str = "unavailable") -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class ResponseStore(Protocol):
    """Every lookup is by (tenant, id): another tenant's object is indistinguishable from a missing one."""

    async def save(self, record: StoredResponse, lease_s: float | None = None) -> bool:
        """Write the record unless it was deleted (then False). With `lease_s` the record is running and its
        owner holds a lease that long; without, any lease ends."""
        ...

    async def renew(self, tenant: str, response_id: str, lease_s: float) -> bool:
        """Extend a running record's lease; False only when it was deleted (a record lost otherwise, as
        with a Redis restarted empty, is not deleted: its final save writes it again)."""
        ...

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...

    async def index_tool_calls(self, entries: list[StoredCot], response_id: str | None = None) -> bool:
        """Keep each entry under its call id (tied to `response_id` when given: not once it is deleted)."""
        ...

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None: ...

    async def health(self) -> str | None:
        """None when the store takes writes; else why not."""
        ...

    async def aclose(self) -> None: ...
