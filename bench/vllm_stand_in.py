"""A stand-in for vLLM's server with its prefix cache and its KV-cache events, for bench/fleet_routing_bench.py's
`--vllm-stand-in` rows: `/v1/completions` as vLLM streams it (the test suite's fake vLLM, answering `{"a": 1}`), a
prefix cache of 16-token blocks named by a hash chain over the token ids from a seed of its own (the first block with
the request's `cache_salt`), least recently used evicted past its capacity, `cached_tokens` reported as vLLM reports
them (the prompt's leading blocks held, its last token always run), and each block stored or evicted published as
vLLM's ZmqEventPublisher publishes it (an 8-byte sequence number and a msgpack EventBatch of BlockStored /
BlockRemoved; an empty batch every half second, so that a subscriber joining late is in step). A prompt's tokens not
held cost PREFILL_S_PER_TOKEN each, one prompt at a time (the server's compute), so a miss is slower than a hit."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import hashlib
import threading
import time
from typing import Any

import msgpack
import zmq
from aiohttp import web
from fake_upstreams import FakeUpstream
from redis_servers import free_port

BLOCK = 16
CAPACITY_BLOCKS = 4096  # 65,536 positions of KV, as the engine servers' pool
PREFILL_S_PER_TOKEN = 0.0005
TOKEN_DELAY_S = 0.01
HEARTBEAT_S = 0.5
SCRIPT = {"rules": [{"emit": [{"analysis": "Answer."}, {"final": '{"a": 1}'}]}]}  # the bench's JSON schema's

# the request being served, in its own task: its cached tokens and its salt
_cached: contextvars.ContextVar[int] = contextvars.ContextVar("cached", default=0)
_salt: contextvars.ContextVar[str | None] = contextvars.ContextVar("salt", default=None)


class VllmStandIn(FakeUpstream):
    def __init__(self) -> None:
        super().__init__("vllm", SCRIPT, token_delay_s=TOKEN_DELAY_S)
        self.events_port = free_port()
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.bind(f"tcp://127.0.0.1:{self.events_port}")
        self._publish_lock = threading.Lock()
        self._seq = 0
        self._seed = time.time_ns().to_bytes(8, "big")  # vLLM's hash seed is random unless set
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._prefill: asyncio.Lock | None = None
        self.prompt_tokens = 0  # prompt tokens it was given (computed or served from its cache)
        self.in_flight = 0
        self._beating = threading.Event()
        self._heart = threading.Thread(target=self._heartbeat, daemon=True)
        self.process = None  # in this process: no cgroup to confine

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    # the bench's server interface (EngineServer's and LlamaServer's)

    def launch(self) -> None:
        self.start()
        self._beating.set()
        self._heart.start()

    def wait_ready(self, timeout_s: float) -> None:
        return None

    def metrics(self) -> dict[str, float]:
        return {"in_flight": float(self.in_flight), "prompt_tokens": float(self.prompt_tokens)}

    def stop(self) -> None:
        self._beating.clear()
        super().stop()
        with self._publish_lock:
            self._socket.close(linger=0)

    # the cache

    def _chain(self, tokens: list[int], salt: str | None) -> list[bytes]:
        hashes, parent = [], self._seed
        for start in range(0, len(tokens) // BLOCK * BLOCK, BLOCK):
            extra = (salt or "").encode() if start == 0 else b""
            parent = hashlib.sha256(parent + str(tokens[start : start + BLOCK]).encode() + extra).digest()
            hashes.append(parent)
        return hashes

    def _held(self, hashes: list[bytes]) -> int:
        count = 0
        for name in hashes:
            if name not in self._blocks:
                break
            self._blocks.move_to_end(name)
            count += 1
        return count

    def _store(self, tokens: list[int], salt: str | None) -> None:
        hashes = self._chain(tokens, salt)
        new = [index for index, name in enumerate(hashes) if name not in self._blocks]
        for name in hashes:
            self._blocks[name] = None
            self._blocks.move_to_end(name)
        events: list[Any] = []
        if new:
            first = new[0]
            parent = hashes[first - 1] if first else None
            events.append({
                "type": "BlockStored", "block_hashes": hashes[first:], "parent_block_hash": parent,
                "token_ids": tokens[first * BLOCK : len(hashes) * BLOCK], "block_size": BLOCK, "lora_id": None,
                "medium": "GPU", "lora_name": None,
                "extra_keys": [[salt] if first == 0 and salt else None] + [None] * (len(hashes) - first - 1),
            })  # fmt: skip
        evicted = []
        while len(self._blocks) > CAPACITY_BLOCKS:
            evicted.append(self._blocks.popitem(last=False)[0])
        if evicted:
            events.append({"type": "BlockRemoved", "block_hashes": evicted, "medium": "GPU"})
        if events:
            self._publish(events)

    def _publish(self, events: list[Any]) -> None:
        with self._publish_lock:
            if self._socket.closed:
                return
            self._seq += 1
            batch = msgpack.packb({"ts": time.time(), "events": events}, use_bin_type=True)
            self._socket.send_multipart([b"", self._seq.to_bytes(8, "big"), batch])

    def _heartbeat(self) -> None:
        while self._beating.is_set():
            self._publish([])
            time.sleep(HEARTBEAT_S)

    # serving

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt, salt = body.get("prompt") or [], body.get("cache_salt")
        if self._prefill is None:
            self._prefill = asyncio.Lock()
        self.in_flight += 1
        try:
            hashes = self._chain(prompt, salt)
            held = min(self._held(hashes) * BLOCK, max(len(prompt) - 1, 0) // BLOCK * BLOCK)
            async with self._prefill:
                await asyncio.sleep((len(prompt) - held) * PREFILL_S_PER_TOKEN)
            self.prompt_tokens += len(prompt)
            _cached.set(held)
            _salt.set(salt)
            return await super()._generate(request)
        finally:
            self.in_flight -= 1

    async def _stream(self, response: web.StreamResponse, call, prompt: list[int], tokens: list[int], limit: int):
        await super()._stream(response, call, prompt, tokens, limit)
        self._store(prompt + tokens, _salt.get())  # what it answered is cached with the prompt

    def _closing_events(self, prompt: list[int], sent: list[int], limit: int) -> list[dict[str, Any]]:
        events = super()._closing_events(prompt, sent, limit)
        for event in events:
            event["usage"]["prompt_tokens_details"] = {"cached_tokens": _cached.get()}
        return events
