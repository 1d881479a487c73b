"""The ResponseStore protocol shared by the in-memory and Redis stores."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .records import StoredCot, StoredResponse

DEFAULT_TTL_S = 30 * 24 * 3600  # OpenAI keeps stored responses for 30 days
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024


class StoreUnavailable(RuntimeError):
    """The backing store cannot be reached; callers answer 503, never lose acknowledged data silently."""


@runtime_checkable
class ResponseStore(Protocol):
    """Every lookup is by (tenant, id): another tenant's object is indistinguishable from a missing one."""

    async def save(self, record: StoredResponse) -> None: ...

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...

    async def index_tool_calls(self, entries: list[StoredCot]) -> None: ...

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None: ...

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...
