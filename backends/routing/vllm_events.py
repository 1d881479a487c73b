"""Following a vLLM server's KV-cache events (`--kv-events-config`, ZMQ PUB) into a PublishedPages.

The wire, as vLLM's `vllm/distributed/kv_events.py` sends it: three frames, the topic, an 8-byte big-endian
sequence number and a msgpack `EventBatch` (`ts`, `events`, `data_parallel_rank`), each event a `BlockStored`
(`block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, ..., `extra_keys`: one entry a block),
`BlockRemoved` (`block_hashes`) or `AllBlocksCleared`; structs as maps tagged by `type`, or, in releases that
encode them array-like, as arrays led by the tag.

vLLM's block hashes are seeded at random per process unless PYTHONHASHSEED is set, so they are not recomputed:
each stored block is named again by the gateway's own chain (backends/page_names.py) over its token ids, in the
namespace of its request's `cache_salt` (the first block's extra keys carry it), and vLLM's hash is kept only to
resolve later events. The gateway sends each tenant's salt (backends/cache_salt.py), so a router computes a
request's names from its tenant alone; blocks without a salt, or whose chain began before the subscription, are
not counted. A gap in the sequence numbers (the PUB socket dropped messages) forgets everything known, as the
server may have stored and evicted meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b
from typing import Any

import msgpack
import structlog
import zmq
import zmq.asyncio

from backends.page_names import ROOT, chain

from .held_pages import PublishedPages

log = structlog.get_logger("backends.routing")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
STRUCT_FIELDS = {  # field order of the array-like encoding, after the tag
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                    "extra_keys"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}  # fmt: skip


def salt_namespace(salt: str) -> bytes:
    """The namespace of the pages a vLLM server stored for requests with this `cache_salt`."""
    return blake2b(f"vllm cache_salt\x1f{salt}".encode(), digest_size=16, key=ROOT).digest()


class VllmIndex:
    """vLLM's events applied to `pages`: vLLM's block hashes mapped to the gateway's page names."""

    def __init__(self, pages: PublishedPages) -> None:
        self.pages = pages
        self._names: dict[Any, bytes] = {}  # vLLM block hash → page name
        self._seq: int | None = None

    def receive(self, seq: int, batch: Any) -> None:
        if self._seq is not None and seq != self._seq + 1:
            log.warning("kv_events_gap", expected=self._seq + 1, got=seq)
            self.clear()
        self._seq = seq
        if not self.pages.in_sync:
            self.pages.reset("vllm", 0, False, seq, ())
            self.pages.by_salt = True
        self.pages.seq = seq
        events = batch[1] if isinstance(batch, list) else batch.get("events", [])
        for event in events or []:
            self._apply(_fields(event))

    def clear(self) -> None:
        self._names.clear()
        self.pages.reset("vllm", self.pages.page_size, False, self._seq or 0, ())
        self.pages.by_salt = True

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "AllBlocksCleared":
            self.clear()
        elif kind == "BlockRemoved":
            for block in event.get("block_hashes") or []:
                name = self._names.pop(_key(block), None)
                if name is not None and self.pages.names is not None:
                    self.pages.names.discard(name)
        elif kind == "BlockStored":
            self._stored(event)

    def _stored(self, event: dict[str, Any]) -> None:
        hashes, size = event.get("block_hashes") or [], event.get("block_size")
        tokens = event.get("token_ids") or []
        if type(size) is not int or size <= 0 or len(tokens) != len(hashes) * size:
            return
        self.pages.page_size = size
        parent = event.get("parent_block_hash")
        if parent is None:
            salt = _salt((event.get("extra_keys") or [None])[0])
            if salt is None:
                return  # no salt: no tenant to name it under
            previous = salt_namespace(salt)
        else:
            previous = self._names.get(_key(parent))
            if previous is None:
                return  # its chain began before we listened
        names = chain(previous, tokens, size, previous=previous)
        for block, name in zip(hashes, names, strict=True):
            self._names[_key(block)] = name
            if self.pages.names is not None:
                self.pages.names.add(name)


def _fields(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return event
    if isinstance(event, list) and event and isinstance(event[0], str):
        return {"type": event[0], **dict(zip(STRUCT_FIELDS.get(event[0], ()), event[1:], strict=False))}
    return {}


def _key(block: Any) -> Any:
    return bytes(block) if isinstance(block, bytes | bytearray | list) else block


def _salt(extra: Iterable[Any] | None) -> str | None:
    for key in extra or ():
        if isinstance(key, str):
            return key
    return None


async def follow(endpoint: str, pages: PublishedPages) -> None:
    """Subscribe to `endpoint` (tcp://host:port) and keep `pages` in step until cancelled."""
    context = zmq.asyncio.Context.instance()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    index = VllmIndex(pages)
    try:
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                continue
            try:
                batch = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
                index.receive(int.from_bytes(frames[1], "big", signed=True), batch)
            except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
                log.warning("kv_events_unreadable", endpoint=endpoint, reason=type(exc).__name__)
                index.clear()
    finally:
        pages.lose()
        socket.close(linger=0)
