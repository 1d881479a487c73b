"""Conversations (the Conversations API, and `conversation` on a response): a conversation's metadata and its
items in order, tenant-scoped, with the store's TTL renewed by every write. In Redis the metadata is one key
and the items a list beside it (same hash tag), sealed like records when encryption at rest is on; an append
to a deleted conversation is refused atomically, so a DELETE is final."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .redis_client import redis_errors_as_unavailable
from .redis_json_store import RedisJsonStore
from .store import DEFAULT_TTL_S

MAX_ITEMS = 10_000  # items one conversation may hold


@dataclass(slots=True)
class StoredConversation:
    id: str
    tenant: str
    created_at: int
    metadata: dict[str, str] = field(default_factory=dict)

    def to_api(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


class ConversationFull(Exception):
    """The conversation already holds MAX_ITEMS items."""


class ConversationStore(Protocol):
    async def create(self, conversation: StoredConversation, items: list[dict[str, Any]]) -> None: ...

    async def load(self, tenant: str, conversation_id: str) -> StoredConversation | None: ...

    async def update(self, conversation: StoredConversation) -> bool:
        """Replace the metadata; False when the conversation is gone."""
        ...

    async def delete(self, tenant: str, conversation_id: str) -> bool: ...

    async def append(self, tenant: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Add items at the end; False when the conversation is gone, ConversationFull past MAX_ITEMS."""
        ...

    async def items(self, tenant: str, conversation_id: str) -> list[dict[str, Any]] | None:
        """Every item in order; None when the conversation is gone."""
        ...

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryConversations:
    def __init__(self, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._conversations: dict[tuple[str, str], tuple[float, StoredConversation, list[dict[str, Any]]]] = {}

    def _get(self, tenant: str, conversation_id: str) -> tuple[StoredConversation, list[dict[str, Any]]] | None:
        key = (tenant, conversation_id)
        entry = self._conversations.get(key)
        if entry is None or entry[0] < time.monotonic():
            self._conversations.pop(key, None)
            return None
        return entry[1], entry[2]

    def _put(self, conversation: StoredConversation, items: list[dict[str, Any]]) -> None:
        key = (conversation.tenant, conversation.id)
        self._conversations[key] = (time.monotonic() + self._ttl_s, conversation, items)

    async def create(self, conversation: StoredConversation, items: list[dict[str, Any]]) -> None:
        self._put(conversation, list(items))

    async def load(self, tenant: str, conversation_id: str) -> StoredConversation | None:
        found = self._get(tenant, conversation_id)
        return None if found is None else found[0]

    async def update(self, conversation: StoredConversation) -> bool:
        found = self._get(conversation.tenant, conversation.id)
        if found is None:
            return False
        self._put(conversation, found[1])
        return True

    async def delete(self, tenant: str, conversation_id: str) -> bool:
        return self._conversations.pop((tenant, conversation_id), None) is not None

    async def append(self, tenant: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        found = self._get(tenant, conversation_id)
        if found is None:
            return False
        if len(found[1]) + len(items) > MAX_ITEMS:
            raise ConversationFull
        self._put(found[0], [*found[1], *items])
        return True

    async def items(self, tenant: str, conversation_id: str) -> list[dict[str, Any]] | None:
        found = self._get(tenant, conversation_id)
        return None if found is None else list(found[1])

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        found = self._get(tenant, conversation_id)
        if found is None or not any(item.get("id") == item_id for item in found[1]):
            return False
        self._put(found[0], [item for item in found[1] if item.get("id") != item_id])
        return True

    async def aclose(self) -> None:
        return None


# KEYS: conversation, items. ARGV: ttl seconds, max items, blobs... → 1 appended, 0 gone, -1 full
_APPEND_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('LLEN', KEYS[2]) + #ARGV - 2 > tonumber(ARGV[2]) then return -1 end
for i = 3, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"""


class RedisConversations(RedisJsonStore):
    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._append = client.register_script(_APPEND_LUA)

    def _keys(self, tenant: str, conversation_id: str) -> tuple[str, str]:
        return self._key("conv", tenant, conversation_id), self._key("citems", tenant, conversation_id)

    async def create(self, conversation: StoredConversation, items: list[dict[str, Any]]) -> None:
        head, body = self._keys(conversation.tenant, conversation.id)
        async with redis_errors_as_unavailable("create conversation"):
            pipe = self._redis.pipeline(transaction=True)
            pipe.set(head, self._blob(asdict(conversation), head), ex=self._ttl_s)
            pipe.delete(body)
            if items:
                pipe.rpush(body, *(self._blob(item, body) for item in items))
                pipe.expire(body, self._ttl_s)
            await pipe.execute()

    async def load(self, tenant: str, conversation_id: str) -> StoredConversation | None:
        head, _ = self._keys(tenant, conversation_id)
        async with redis_errors_as_unavailable("load conversation"):
            blob = await self._redis.get(head)
        if blob is None:
            return None
        conversation = StoredConversation(**self._value(blob, head))
        return conversation if conversation.tenant == tenant else None

    async def update(self, conversation: StoredConversation) -> bool:
        head, body = self._keys(conversation.tenant, conversation.id)
        async with redis_errors_as_unavailable("update conversation"):
            stored = await self._redis.set(head, self._blob(asdict(conversation), head), xx=True, ex=self._ttl_s)
            await self._redis.expire(body, self._ttl_s)
        return bool(stored)

    async def delete(self, tenant: str, conversation_id: str) -> bool:
        head, body = self._keys(tenant, conversation_id)
        async with redis_errors_as_unavailable("delete conversation"):
            removed = await self._redis.delete(head, body)
        return removed > 0

    async def append(self, tenant: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        head, body = self._keys(tenant, conversation_id)
        blobs = [self._blob(item, body) for item in items]
        async with redis_errors_as_unavailable("append to conversation"):
            answer = await self._append(keys=[head, body], args=[self._ttl_s, MAX_ITEMS, *blobs])
        if answer == -1:
            raise ConversationFull
        return answer == 1

    async def items(self, tenant: str, conversation_id: str) -> list[dict[str, Any]] | None:
        head, body = self._keys(tenant, conversation_id)
        async with redis_errors_as_unavailable("read conversation"):
            pipe = self._redis.pipeline(transaction=True)
            pipe.exists(head)
            pipe.lrange(body, 0, -1)
            exists, blobs = await pipe.execute()
        if not exists:
            return None
        return [self._value(blob, body) for blob in blobs]

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        _, body = self._keys(tenant, conversation_id)
        async with redis_errors_as_unavailable("delete conversation item"):
            for blob in await self._redis.lrange(body, 0, -1):
                if self._value(blob, body).get("id") == item_id:
                    return await self._redis.lrem(body, 1, blob) == 1
        return False
