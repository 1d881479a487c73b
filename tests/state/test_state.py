"""ResponseStore behaviour, identical on the in-memory store and on a real redis-server."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import redis as redis_sync
from redis_servers import RedisServer, SentinelServer, start_cluster

from state import MemoryStore, RecordTooLarge, RedisStore, ResponseStore, StoredCot, StoredResponse, StoreUnavailable
from state.records import OWNER_STOPPED, encode
from state.redis_client import connect
from state.store import DEFAULT_MAX_RECORD_BYTES


def record(tenant="tenant-a", rid="resp_1", size=10) -> StoredResponse:
    return StoredResponse(
        id=rid,
        tenant=tenant,
        created_at=time.time(),
        response={"id": rid, "status": "completed", "output": [{"type": "message", "text": "x" * size}]},
        conversation=[{"role": "assistant", "channel": "analysis", "content": "thinking ü"}],
        input_items=[{"type": "message", "role": "user", "content": "hi"}],
    )


def cot(call_id="call_1", tenant="tenant-a") -> StoredCot:
    return StoredCot(
        call_id, tenant, "get_weather", '{"city":"Paris"}', [{"channel": "analysis", "content": "need it"}]
    )


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(params=["memory", "redis"])
def with_store(request, redis_server):
    """Runs `scenario(store)` in a fresh event loop with a fresh store of each kind, then closes it."""

    def run(scenario):
        async def body():
            if request.param == "memory":
                store: ResponseStore = MemoryStore()
            else:
                redis_sync.Redis(port=redis_server.port).flushall()
                store = RedisStore.from_url(redis_server.url)
            try:
                await scenario(store)
            finally:
                await store.aclose()

        asyncio.run(body())

    return run


def test_save_load_delete_and_tenant_isolation(with_store):
    async def scenario(store):
        assert isinstance(store, ResponseStore)
        saved = record()
        await store.save(saved)
        assert await store.load("tenant-a", "resp_1") == saved
        assert await store.load("tenant-b", "resp_1") is None
        assert await store.delete("tenant-b", "resp_1") is False
        assert await store.load("tenant-a", "resp_1") == saved
        assert await store.delete("tenant-a", "resp_1") is True
        assert await store.delete("tenant-a", "resp_1") is False
        assert await store.load("tenant-a", "resp_1") is None
        assert await store.health() is None

    with_store(scenario)


def running(rid="resp_1") -> StoredResponse:
    saved = record(rid=rid)
    saved.response["status"] = "in_progress"
    return saved


def test_a_running_record_whose_lease_runs_out_reads_as_failed(with_store):
    async def scenario(store):
        await store.save(running(), lease_s=0.3)
        assert (await store.load("tenant-a", "resp_1")).response["status"] == "in_progress"
        await asyncio.sleep(0.2)
        assert await store.renew("tenant-a", "resp_1", 0.3)  # the owner renews: still running
        await asyncio.sleep(0.2)
        assert (await store.load("tenant-a", "resp_1")).response["status"] == "in_progress"
        await asyncio.sleep(0.25)  # the owner stopped renewing
        orphan = (await store.load("tenant-a", "resp_1")).response
        assert orphan["status"] == "failed" and orphan["error"] == {"code": "server_error", "message": OWNER_STOPPED}
        done = record()
        assert await store.save(done)  # a final save (no lease) is terminal for good
        await asyncio.sleep(0.35)
        assert (await store.load("tenant-a", "resp_1")).response["status"] == "completed"
        assert await store.renew("tenant-a", "resp_9", 1)  # nothing to renew, but not deleted either
        assert await store.load("tenant-a", "resp_9") is None

    with_store(scenario)


def test_delete_is_final_and_takes_the_cot_index_with_it(with_store):
    async def scenario(store):
        await store.save(running(), lease_s=30)
        await store.index_tool_calls([cot("call_1"), cot("call_2")], "resp_1")
        await store.index_tool_calls([cot("chat_call")])  # a Chat turn's, tied to no response
        assert await store.delete("tenant-a", "resp_1")
        assert await store.find_cot("tenant-a", "call_1") is None and await store.find_cot("tenant-a", "call_2") is None
        assert await store.find_cot("tenant-a", "chat_call") is not None
        assert not await store.save(record())  # the run's final save after the delete writes nothing
        assert not await store.save(running(), lease_s=30)
        assert not await store.renew("tenant-a", "resp_1", 30)
        assert not await store.index_tool_calls([cot("call_3")], "resp_1")
        assert await store.load("tenant-a", "resp_1") is None
        assert await store.find_cot("tenant-a", "call_3") is None
        assert await store.delete("tenant-a", "resp_1") is False
        assert await store.save(record(tenant="tenant-b"))  # another tenant's same id is its own record

    with_store(scenario)


def test_cot_index_by_call_id_is_tenant_scoped(with_store):
    async def scenario(store):
        await store.index_tool_calls([cot("call_1"), cot("call_2")])
        assert await store.find_cot("tenant-a", "call_2") == cot("call_2")
        assert await store.find_cot("tenant-b", "call_1") is None
        assert await store.find_cot("tenant-a", "call_9") is None

    with_store(scenario)


def test_large_records_are_compressed_and_capped(with_store):
    async def scenario(store):
        big = record(size=200_000)
        await store.save(big)
        assert await store.load("tenant-a", "resp_1") == big

    with_store(scenario)
    big = record(size=200_000)
    blob = encode(big, DEFAULT_MAX_RECORD_BYTES)
    assert blob[:1] == b"Z" and len(blob) < 10_000  # compressed above COMPRESS_ABOVE_BYTES
    assert encode(record(), DEFAULT_MAX_RECORD_BYTES)[:1] == b"J"  # small records stay plain JSON
    incompressible = record()
    incompressible.response["output"] = [os.urandom(3000).hex()]
    with pytest.raises(RecordTooLarge, match="the cap is 1000"):
        asyncio.run(MemoryStore(max_record_bytes=1000).save(incompressible))


def test_redis_keys_carry_the_tenant_hash_tag_and_ttl(redis_server):
    redis_sync.Redis(port=redis_server.port).flushall()
    store = RedisStore.from_url(redis_server.url, ttl_s=100)

    async def scenario():
        await store.save(record(), lease_s=30)
        await store.index_tool_calls([cot()], "resp_1")
        await store.aclose()

    asyncio.run(scenario())
    client = redis_sync.Redis(port=redis_server.port)
    keys = sorted(k.decode() for k in client.keys("*"))
    assert len(keys) == 4 and all(k.startswith("gw:{t:") for k in keys)  # record, lease, CoT, its call ids
    assert len({k.split("}")[0] for k in keys}) == 1  # one tenant, one slot
    assert all(0 < client.ttl(k) <= 100 for k in keys)
    assert b"tenant-a" not in b"".join(k.encode() for k in keys)  # tenant ids are hashed in key names


def test_memory_store_expires_and_evicts():
    now = [1000.0]
    store = MemoryStore(ttl_s=10, max_records=3, clock=lambda: now[0])

    async def scenario():
        for i in range(4):
            await store.save(record(rid=f"r{i}"))
        assert await store.load("tenant-a", "r0") is None  # evicted: least recently used
        assert await store.load("tenant-a", "r1") is not None  # touched: now most recent
        await store.save(record(rid="r4"))
        assert await store.load("tenant-a", "r2") is None
        assert await store.load("tenant-a", "r1") is not None
        now[0] += 11
        assert await store.load("tenant-a", "r1") is None  # expired
        assert len(store) == 2

    asyncio.run(scenario())
    by_bytes = MemoryStore(max_total_bytes=3000)
    for i in range(10):
        asyncio.run(by_bytes.save(record(rid=f"b{i}", size=500)))
    assert by_bytes.total_bytes <= 3000 and len(by_bytes) < 10


def test_redis_outage_raises_store_unavailable_and_recovers(tmp_path):
    server = RedisServer(tmp_path / "outage").start()
    store = RedisStore.from_url(server.url)

    async def scenario():
        await store.save(record())
        server.stop()
        with pytest.raises(StoreUnavailable):
            await store.load("tenant-a", "resp_1")
        with pytest.raises(StoreUnavailable):
            await store.save(record(rid="resp_2"))
        assert await store.health() == "Redis is unreachable"
        server.start()  # same port, empty (no persistence): the client reconnects by itself
        assert await store.health() is None
        await store.save(record(rid="resp_3"))
        assert (await store.load("tenant-a", "resp_3")).id == "resp_3"
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_sentinel_url(tmp_path):
    master = RedisServer(tmp_path / "master").start()
    sentinel = SentinelServer(tmp_path / "sentinel", master).start()
    try:
        store = RedisStore.from_url(f"redis+sentinel://127.0.0.1:{sentinel.port}/gateway/0")

        async def scenario():
            await store.save(record())
            assert (await store.load("tenant-a", "resp_1")).id == "resp_1"
            await store.aclose()

        asyncio.run(scenario())
        assert redis_sync.Redis(port=master.port).dbsize() == 1
    finally:
        sentinel.stop()
        master.stop()


def test_cluster_url(tmp_path):
    nodes = start_cluster(tmp_path)
    try:
        store = RedisStore.from_url(f"redis+cluster://127.0.0.1:{nodes[0].port}")

        async def scenario():
            for tenant in ("t1", "t2", "t3", "t4"):  # every script's keys are in the tenant's slot
                await store.save(record(tenant=tenant), lease_s=30)
                assert await store.renew(tenant, "resp_1", 30)
                await store.index_tool_calls([cot("c1", tenant), cot("c2", tenant)], "resp_1")
                assert (await store.load(tenant, "resp_1")).tenant == tenant
                assert (await store.find_cot(tenant, "c2")).call_id == "c2"
                assert await store.delete(tenant, "resp_1")
                assert await store.find_cot(tenant, "c2") is None
                assert not await store.save(record(tenant=tenant))
            await store.aclose()

        asyncio.run(scenario())
    finally:
        for node in nodes:
            node.stop()


@pytest.mark.parametrize(
    ("url", "error"),
    [("redis+sentinel://127.0.0.1:26379", "service name"), ("memcached://x", "unsupported Redis URL scheme")],
)
def test_bad_urls(url, error):
    with pytest.raises(ValueError, match=error):
        connect(url)


def _not_redis_server() -> tuple[int, object]:
    """A TCP service that answers anything with an HTTP error page, as a wrong port in the URL would."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], listener


def test_every_redis_failure_is_store_unavailable_with_its_reason(tmp_path):
    """Out of memory, a wrong password, a non-Redis service, a dead server: never a raw Redis error."""
    full = RedisServer(tmp_path / "full", extra=("--maxmemory-policy", "noeviction")).start()
    locked = RedisServer(tmp_path / "locked", extra=("--requirepass", "right-password")).start()
    http_port, http = _not_redis_server()
    try:
        ballast = redis_sync.Redis(port=full.port)
        ballast.set("ballast", b"x" * 2_000_000)
        ballast.config_set("maxmemory", "1mb")  # far below what it holds: writes refused

        async def scenario():
            cases = [
                (f"redis://127.0.0.1:{full.port}/0", "out of memory"),
                (f"redis://:wrong@127.0.0.1:{locked.port}/0", "authentication failed"),
                (f"redis://127.0.0.1:{http_port}/0", "does not speak the Redis protocol"),
                ("redis://127.0.0.1:1/0", "unreachable"),
            ]
            for url, reason in cases:
                store = RedisStore.from_url(url)
                with pytest.raises(StoreUnavailable, match=reason):
                    await store.save(record())
                assert reason in await store.health()
                await store.aclose()

        asyncio.run(scenario())
    finally:
        http.close()
        full.stop()
        locked.stop()


def test_the_first_command_after_a_redis_restart_succeeds(tmp_path):
    """A pooled connection that the restart closed is replaced transparently, not answered with an error."""
    server = RedisServer(tmp_path / "restart").start()
    store = RedisStore.from_url(server.url)

    async def scenario():
        await store.save(record())
        server.stop()
        server.start()
        await store.save(record(rid="resp_2"))  # no StoreUnavailable
        assert (await store.load("tenant-a", "resp_2")).id == "resp_2"
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
