"""Precise routing over vLLM servers by their KV-cache events: a stand-in that publishes vLLM's wire (ZMQ PUB, an
8-byte sequence number, a msgpack EventBatch of BlockStored / BlockRemoved / AllBlocksCleared, structs as maps
tagged by `type` or array-like), beside fake vLLM servers, and the `vllm` backend kind reading both."""

from __future__ import annotations

import asyncio
import hashlib
import time

import msgpack
import pytest
import zmq
from fake_upstreams import STOPS, FakeUpstream
from gateway_fixtures import SCRIPT
from redis_servers import free_port

from backends.base import GenerateRequest, Sampling
from backends.registry import create_backend
from harmony import load_harmony_encoding

BLOCK = 16


class VllmEventsStandIn:
    """What vLLM's ZmqEventPublisher sends for the requests a fake vLLM received, block hashes of its own (as a
    vLLM process with a random hash seed would make them)."""

    def __init__(self, array_like: bool = False) -> None:
        self.port = free_port()
        self.array_like = array_like
        self.seq = 0
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.bind(f"tcp://127.0.0.1:{self.port}")
        self._seed = time.time_ns().to_bytes(8, "big")

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def block_hashes(self, tokens: list[int], salt: str) -> list[bytes]:
        hashes, parent = [], self._seed
        for start in range(0, len(tokens) // BLOCK * BLOCK, BLOCK):
            extra = salt.encode() if start == 0 else b""
            parent = hashlib.sha256(parent + str(tokens[start : start + BLOCK]).encode() + extra).digest()
            hashes.append(parent)
        return hashes

    def _event(self, kind: str, **fields) -> object:
        if not self.array_like:
            return {"type": kind, **fields}
        order = {
            "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                            "lora_name", "extra_keys"),
            "BlockRemoved": ("block_hashes", "medium"),
            "AllBlocksCleared": (),
        }[kind]  # fmt: skip
        return [kind, *(fields.get(name) for name in order)]

    def publish(self, events: list[object], skip: int = 0) -> None:
        self.seq += 1 + skip
        batch = [time.time(), events, 0] if self.array_like else {"ts": time.time(), "events": events}
        self._socket.send_multipart([b"", self.seq.to_bytes(8, "big"), msgpack.packb(batch, use_bin_type=True)])

    def stored(self, tokens: list[int], salt: str) -> list[bytes]:
        hashes = self.block_hashes(tokens, salt)
        count = len(hashes) * BLOCK
        extra = [[salt]] + [None] * (len(hashes) - 1)
        event = self._event(
            "BlockStored",
            block_hashes=hashes,
            parent_block_hash=None,
            token_ids=tokens[:count],
            block_size=BLOCK,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=extra,
        )
        self.publish([event])
        return hashes

    def removed(self, hashes: list[bytes]) -> None:
        self.publish([self._event("BlockRemoved", block_hashes=hashes, medium="GPU")])

    def close(self) -> None:
        self._socket.close(linger=0)


def _request(prompt: list[int], tenant: str) -> GenerateRequest:
    return GenerateRequest(prompt, 8, tuple(STOPS), "r", sampling=Sampling(temperature=0), tenant=tenant)


@pytest.mark.parametrize("array_like", [False, True], ids=["maps", "array_like"])
def test_vllm_kv_events_route_a_tenant_s_prefix_to_the_server_that_stored_it(array_like, monkeypatch):
    monkeypatch.setenv("GATEWAY_KEY_SECRET", "a-shared-secret-of-the-replicas")
    upstreams = [FakeUpstream("vllm", SCRIPT).start() for _ in range(3)]
    publishers = [VllmEventsStandIn(array_like) for _ in upstreams]
    options = {
        "urls": [u.url for u in upstreams],
        "kv_events_endpoints": [p.endpoint for p in publishers],
        "load_metrics_interval_s": 0,
    }
    encoding = load_harmony_encoding()
    prompt = [200006, 17360, 200008, *range(5000, 5100)]

    async def scenario() -> dict:
        backend = create_backend("vllm", options, encoding)
        router = backend.router
        seen: dict = {}
        try:
            await backend.ready()  # starts the subscriptions
            views = list(router.servers.values())
            deadline = time.monotonic() + 10
            while not all(view.published.in_sync for view in views):  # PUB drops what precedes a subscription
                assert time.monotonic() < deadline, "the stand-ins' events never arrived"
                for publisher in publishers:
                    publisher.stored(list(range(BLOCK)), "")  # no salt: counted as no tenant's
                await asyncio.sleep(0.05)
            candidates = {url: 0 for url in router.servers}
            holder = 1
            salt = backend.dialect.salt("tenant-a")
            hashes = publishers[holder].stored(prompt, salt)
            await asyncio.sleep(0.3)
            seen["a"] = router.choose(_request([*prompt, 7, 8, 9], "tenant-a"), candidates)
            seen["b"] = router.choose(_request([*prompt, 7, 8, 9], "tenant-b"), candidates)
            publishers[holder].removed(hashes)
            await asyncio.sleep(0.3)
            seen["evicted"] = router.choose(_request([*prompt, 7, 8, 9], "tenant-c-never-routed"), candidates)
            seen["a_after_eviction"] = router.choose(_request([*prompt, 1], "tenant-a"), candidates)
            publishers[2].stored(prompt, salt)
            publishers[2].publish([], skip=3)  # the PUB socket dropped three batches: what it held is unknown
            await asyncio.sleep(0.3)
            seen["after_gap"] = router.choose(_request([*prompt, 2], "tenant-a"), candidates)
            seen["urls"] = list(router.servers)
            seen["in_sync"] = [view.published.in_sync for view in views]
            # a generation through the backend carries the salt vLLM names its blocks with
            async for _ in backend.generate(_request(prompt, "tenant-a")):
                pass
        finally:
            await backend.aclose()
            for publisher in publishers:
                publisher.close()
            for upstream in upstreams:
                upstream.stop()
        seen["salt"] = salt
        return seen

    seen = asyncio.run(scenario())
    urls = seen["urls"]
    assert (seen["a"].url, seen["a"].how) == (urls[1], "prefix")
    assert seen["a"].matched_tokens == len(prompt) // BLOCK * BLOCK
    assert seen["b"].matched_tokens == 0  # another tenant: another salt, nothing held for it
    assert seen["evicted"].matched_tokens == 0
    # evicted on the server: only what was routed there (tenant-a's, noted when chosen) could still count, and the
    # events say the server holds none of it
    assert seen["a_after_eviction"].matched_tokens == 0
    assert seen["after_gap"].matched_tokens == 0 and all(seen["in_sync"])
    sent = [call.body["cache_salt"] for upstream in upstreams for call in upstream.calls]
    assert sent == [seen["salt"]]


def test_kv_events_endpoints_are_checked_at_start(monkeypatch):
    encoding = load_harmony_encoding()
    with pytest.raises(ValueError, match="one endpoint for each of urls"):
        create_backend(
            "vllm", {"urls": ["http://a:1", "http://b:1"], "kv_events_endpoints": ["tcp://a:5557"]}, encoding
        )
    with pytest.raises(ValueError, match="tcp://host:port"):
        create_backend("vllm", {"urls": ["http://a:1"], "kv_events_endpoints": ["http://a:5557"]}, encoding)
    with pytest.raises(ValueError, match="only vllm reads KV events"):
        create_backend("llamacpp", {"urls": ["http://a:1"], "kv_events_endpoints": ["tcp://a:5557"]}, encoding)
    with pytest.raises(ValueError, match="only vllm reads KV events"):
        options = {"urls": ["http://a:1"], "kv_events_endpoints": ["tcp://a:5557"], "cache_salt": False}
        create_backend("vllm", options, encoding)
