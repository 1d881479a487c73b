"""The usage ledger: one record per finished response or chat completion, to bill tenants from.

In Redis, each tenant's records are a Stream (`usage` under the tenant's hash tag) trimmed to the retention as
records are added; a record is added together with a marker of its response id (`usage-seen`, kept as long as
the retention) in one script, so a record written twice (a retried write, a replica retrying after a dropped
connection) is kept once. Entry ids are the time the record was kept, in milliseconds, which gives the export
its order and its cursor. A Batch API line is kept once by its batch and custom id instead: a line run again after
its replica died is billed once. Records are sealed like the store's when encryption at rest is on. Without Redis, a
bounded list per tenant in this process.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .redis_client import redis_errors_as_unavailable
from .redis_json_store import RedisJsonStore

DEFAULT_RETENTION_S = 90 * 24 * 3600
MEMORY_RECORDS_PER_TENANT = 100_000
MAX_PAGE = 1000

# KEYS: seen marker, stream. ARGV: retention seconds, the oldest entry id kept (ms), the sealed record.
_RECORD_LUA = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
redis.call('XADD', KEYS[2], 'MINID', ARGV[2], '*', 'r', ARGV[3])
return 1
"""


@dataclass(slots=True)  # not frozen: one is made for every answer, and a frozen init costs 5x a plain one
class UsageRecord:
    response_id: str  # resp_... or chatcmpl-...: at most one record each
    tenant: str
    key_id: str | None  # the API key's id (None: authentication off)
    api: str  # "responses" or "chat.completions"
    model: str
    status: str  # completed, incomplete, failed, cancelled
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    tool_calls: dict[str, int] = field(default_factory=dict)  # output item type → count (function_call, mcp_call…)
    created_at: float = 0.0  # when the request began (Unix seconds)
    completed_at: float = 0.0  # when it finished
    service_tier: str = "default"  # the tier it ran at (priority, default, flex), to price it by
    batch_line: str | None = None  # "batch_id/custom_id" for a Batch API line: billed once however often it ran

    @property
    def once_per(self) -> str:
        """What the ledger keeps one record for: the batch line, else the response."""
        return self.batch_line or self.response_id

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageRecord:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


@dataclass(frozen=True, slots=True)
class UsagePage:
    records: list[UsageRecord]
    cursors: list[str]  # each record's place (its entry id): `after` resumes past it
    has_more: bool


class UsageLedger(Protocol):
    in_process: bool  # kept in this process's memory: a write never waits

    async def record(self, entry: UsageRecord) -> bool:
        """Keep the record; False when one for its response id was kept already. StoreUnavailable when it
        cannot be kept now (a retry is safe)."""
        ...

    async def page(self, tenant: str, since: float, after: str | None, limit: int) -> UsagePage:
        """The tenant's records kept at `since` (Unix seconds) or later, oldest first, past cursor `after`."""
        ...

    async def aclose(self) -> None: ...


def _entry_id(value: str) -> tuple[int, int]:
    milliseconds, _, sequence = value.partition("-")
    return int(milliseconds), int(sequence or 0)


class MemoryLedger:
    """This process's ledger (no Redis): a bounded list per tenant, ids as Redis would give them."""

    in_process = True

    def __init__(self, retention_s: int = DEFAULT_RETENTION_S, per_tenant: int = MEMORY_RECORDS_PER_TENANT) -> None:
        self._retention_s = retention_s
        self._records: dict[str, deque[tuple[tuple[int, int], UsageRecord]]] = {}  # (entry id, record), oldest first
        self._seen: dict[str, OrderedDict[str, None]] = {}
        self._per_tenant = per_tenant
        self._last = (0, 0)

    def _next_id(self, now_ms: int) -> tuple[int, int]:
        milliseconds, sequence = self._last
        self._last = (now_ms, 0) if now_ms > milliseconds else (milliseconds, sequence + 1)
        return self._last

    async def record(self, entry: UsageRecord) -> bool:
        seen = self._seen.get(entry.tenant)
        if seen is None:
            seen = self._seen[entry.tenant] = OrderedDict()
        elif entry.once_per in seen:
            return False
        seen[entry.once_per] = None
        if len(seen) > 2 * self._per_tenant:
            seen.popitem(last=False)
        records = self._records.get(entry.tenant)
        if records is None:
            records = self._records[entry.tenant] = deque(maxlen=self._per_tenant)
        now = time.time()
        records.append((self._next_id(int(now * 1000)), entry))
        oldest = (int((now - self._retention_s) * 1000), 0)
        while records and records[0][0] < oldest:
            records.popleft()
        return True

    async def page(self, tenant: str, since: float, after: str | None, limit: int) -> UsagePage:
        """Records past `after` (or from `since`): found by bisection (ids grow with each record), so a page
        costs its own length and a logarithm, not the tenant's whole list."""
        start = _entry_id(after) if after else (int(since * 1000), -1)
        records = self._records.get(tenant, deque())
        first = bisect.bisect_right(records, start, key=lambda kept: kept[0])
        chosen = [records[index] for index in range(first, min(first + limit, len(records)))]
        cursors = [f"{milliseconds}-{sequence}" for (milliseconds, sequence), _ in chosen]
        return UsagePage([r for _, r in chosen], cursors, first + limit < len(records))

    async def aclose(self) -> None:
        return None


class RedisLedger(RedisJsonStore):
    """The shared ledger: a Stream per tenant (see the module docstring)."""

    in_process = False

    def __init__(self, client: Any, retention_s: int = DEFAULT_RETENTION_S, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._retention_s = int(retention_s)
        self._script = client.register_script(_RECORD_LUA)

    def _stream(self, tenant: str) -> str:
        return self._key("usage", tenant, "records")

    async def record(self, entry: UsageRecord) -> bool:
        stream = self._stream(entry.tenant)
        seen = self._key("usage-seen", entry.tenant, entry.once_per)
        oldest = int((time.time() - self._retention_s) * 1000)
        async with redis_errors_as_unavailable("record usage"):
            kept = await self._script(
                keys=[seen, stream], args=[self._retention_s, oldest, self._blob(entry.to_json(), stream)]
            )
        return bool(kept)

    async def page(self, tenant: str, since: float, after: str | None, limit: int) -> UsagePage:
        stream = self._stream(tenant)
        start = f"({after}" if after else str(int(since * 1000))
        async with redis_errors_as_unavailable("read usage"):
            entries = await self._redis.xrange(stream, min=start, max="+", count=limit + 1)
        chosen = entries[:limit]
        records = [UsageRecord.from_json(self._value(fields[b"r"], stream)) for _, fields in chosen]
        return UsagePage(records, [ident.decode() for ident, _ in chosen], len(entries) > limit)
