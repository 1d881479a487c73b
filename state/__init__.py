"""Response and chain-of-thought state: the in-memory default and a Redis store for many replicas."""

from .memory import MemoryStore
from .records import RecordTooLarge, StoredCot, StoredResponse
from .redis_store import RedisStore
from .store import ResponseStore, StoreUnavailable

__all__ = [
    "MemoryStore",
    "RecordTooLarge",
    "RedisStore",
    "ResponseStore",
    "StoreUnavailable",
    "StoredCot",
    "StoredResponse",
]
