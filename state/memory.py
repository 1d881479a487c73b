"""The embedded default store: in process, bounded by count and bytes, with a TTL."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from .records import RUNNING, StoredCot, StoredResponse, decode_cot, decode_response, encode, orphaned
from .store import DEFAULT_MAX_RECORD_BYTES, DEFAULT_TTL_S

_Key = tuple[str, str, str]  # (kind, tenant, id)


class MemoryStore:
    """Least-recently-used eviction past `max_records` or `max_total_bytes`; entries expire after `ttl_s`.

    Records are kept serialized, so a caller mutating an object after saving it changes nothing
    stored, and the byte bound is exact. Leases, tombstones and each response's indexed call ids
    follow the same rules as in Redis (see `store`), bounded by `max_records` each.
    """

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_records: int = 10_000,
        max_total_bytes: int = 256 * 1024 * 1024,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_records = max_records
        self._max_total_bytes = max_total_bytes
        self._max_record_bytes = max_record_bytes
        self._clock = clock
        self._entries: OrderedDict[_Key, tuple[float, bytes]] = OrderedDict()
        self._total_bytes = 0
        self._leases: dict[tuple[str, str], float] = {}  # (tenant, response id) → expiry
        self._tombstones: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._calls: OrderedDict[tuple[str, str], list[str]] = OrderedDict()  # (tenant, response id) → call ids

    @property
    def total_bytes(self) -> int:
        return self._total_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, key: _Key, blob: bytes) -> None:
        self._pop(key)
        self._entries[key] = (self._clock() + self._ttl_s, blob)
        self._total_bytes += len(blob)
        while len(self._entries) > self._max_records or self._total_bytes > self._max_total_bytes:
            self._pop(next(iter(self._entries)))

    def _pop(self, key: _Key) -> bytes | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._total_bytes -= len(entry[1])
        return entry[1]

    def _get(self, key: _Key) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            self._pop(key)
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def _deleted(self, tenant: str, response_id: str) -> bool:
        expiry = self._tombstones.get((tenant, response_id))
        return expiry is not None and expiry > self._clock()

    def _bounded(self, table: OrderedDict, key: tuple[str, str], value: object) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self._max_records:
            table.popitem(last=False)

    async def save(self, record: StoredResponse, lease_s: float | None = None) -> bool:
        if self._deleted(record.tenant, record.id):
            return False
        self._put(("response", record.tenant, record.id), encode(record, self._max_record_bytes))
        if lease_s is None:
            self._leases.pop((record.tenant, record.id), None)
        else:
            self._leases[(record.tenant, record.id)] = self._clock() + lease_s
            if len(self._leases) > self._max_records:
                now = self._clock()
                self._leases = {key: expiry for key, expiry in self._leases.items() if expiry > now}
        return True

    async def renew(self, tenant: str, response_id: str, lease_s: float) -> bool:
        if self._deleted(tenant, response_id):
            return False
        if self._get(("response", tenant, response_id)) is not None:
            self._leases[(tenant, response_id)] = self._clock() + lease_s
        return True

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        blob = self._get(("response", tenant, response_id))
        if blob is None:
            return None
        record = decode_response(blob)
        leased = self._leases.get((tenant, response_id), 0.0) > self._clock()
        return orphaned(record) if record.response.get("status") in RUNNING and not leased else record

    async def delete(self, tenant: str, response_id: str) -> bool:
        key = ("response", tenant, response_id)
        if self._get(key) is None:
            return False
        self._pop(key)
        self._leases.pop((tenant, response_id), None)
        self._bounded(self._tombstones, (tenant, response_id), self._clock() + self._ttl_s)
        for call_id in self._calls.pop((tenant, response_id), []):
            self._pop(("cot", tenant, call_id))
        return True

    async def index_tool_calls(self, entries: list[StoredCot], response_id: str | None = None) -> bool:
        if not entries:
            return True
        tenant = entries[0].tenant
        if response_id is not None and self._deleted(tenant, response_id):
            return False
        for entry in entries:
            self._put(("cot", entry.tenant, entry.call_id), encode(entry, self._max_record_bytes))
        if response_id is not None:
            calls = self._calls.get((tenant, response_id), [])
            self._bounded(self._calls, (tenant, response_id), [*calls, *(entry.call_id for entry in entries)])
        return True

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None:
        blob = self._get(("cot", tenant, call_id))
        return None if blob is None else decode_cot(blob)

    async def health(self) -> str | None:
        return None

    async def aclose(self) -> None:
        self._entries.clear()
        self._total_bytes = 0
        self._leases.clear()
        self._tombstones.clear()
        self._calls.clear()
