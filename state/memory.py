"""The embedded default store: in process, bounded by count and bytes, with a TTL."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from .records import StoredCot, StoredResponse, decode_cot, decode_response, encode
from .store import DEFAULT_MAX_RECORD_BYTES, DEFAULT_TTL_S

_Key = tuple[str, str, str]  # (kind, tenant, id)


class MemoryStore:
    """Least-recently-used eviction past `max_records` or `max_total_bytes`; entries expire after `ttl_s`.

    Records are kept serialized, so a caller mutating an object after saving it changes nothing
    stored, and the byte bound is exact.
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

    async def save(self, record: StoredResponse) -> None:
        self._put(("response", record.tenant, record.id), encode(record, self._max_record_bytes))

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        blob = self._get(("response", tenant, response_id))
        return None if blob is None else decode_response(blob)

    async def delete(self, tenant: str, response_id: str) -> bool:
        key = ("response", tenant, response_id)
        return self._get(key) is not None and self._pop(key) is not None

    async def index_tool_calls(self, entries: list[StoredCot]) -> None:
        for entry in entries:
            self._put(("cot", entry.tenant, entry.call_id), encode(entry, self._max_record_bytes))

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None:
        blob = self._get(("cot", tenant, call_id))
        return None if blob is None else decode_cot(blob)

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._entries.clear()
        self._total_bytes = 0
