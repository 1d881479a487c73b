"""The usage ledger, in this process and in a real redis-server: a response's record is kept once however often
it is written, each tenant reads only its own, pages go through ten thousand records in order, and records
past the retention go."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
import redis as redis_sync
from redis_servers import RedisServer

from state.record_cipher import RecordCipher
from state.usage_ledger import MemoryLedger, RedisLedger, UsageLedger, UsageRecord


def entry(response_id: str, tenant: str = "acme", tokens: int = 10) -> UsageRecord:
    return UsageRecord(
        response_id=response_id,
        tenant=tenant,
        key_id="key_1",
        api="responses",
        model="gpt-oss-120b",
        status="completed",
        input_tokens=tokens,
        cached_tokens=tokens // 2,
        output_tokens=tokens * 2,
        reasoning_tokens=1,
        tool_calls={"function_call": 1},
        created_at=time.time(),
        completed_at=time.time(),
    )


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("ledger-redis")).start()
    yield server
    server.stop()


@pytest.fixture(params=["memory", "redis", "redis-sealed"])
def with_ledger(request, redis_server):
    def run(scenario, retention_s: int = 3600):
        async def body():
            if request.param == "memory":
                ledger: UsageLedger = MemoryLedger(retention_s)
            else:
                redis_sync.Redis(port=redis_server.port).flushall()
                cipher = RecordCipher([("k1", b"k" * 32)]) if request.param == "redis-sealed" else None
                ledger = RedisLedger.from_url(redis_server.url, retention_s=retention_s, cipher=cipher)
            try:
                await scenario(ledger)
            finally:
                await ledger.aclose()

        asyncio.run(body())

    return run


def test_a_record_written_twice_is_kept_once_and_tenants_read_only_theirs(with_ledger):
    async def scenario(ledger: UsageLedger) -> None:
        assert await ledger.record(entry("resp_1"))
        assert not await ledger.record(entry("resp_1"))  # a retried write
        assert await ledger.record(entry("resp_2", tokens=20))
        assert await ledger.record(entry("resp_1", tenant="other"))  # the same id in another tenant is its own
        page = await ledger.page("acme", 0, None, 100)
        assert [r.response_id for r in page.records] == ["resp_1", "resp_2"] and not page.has_more
        assert UsageRecord.from_json(page.records[1].to_json()) == page.records[1]
        assert page.records[1].input_tokens == 20 and page.records[1].tool_calls == {"function_call": 1}
        other = await ledger.page("other", 0, None, 100)
        assert [r.tenant for r in other.records] == ["other"]
        assert (await ledger.page("nobody", 0, None, 100)).records == []

    with_ledger(scenario)


def test_a_batch_line_run_twice_is_billed_once(with_ledger):
    """A Batch API line run again after its replica died answers with another response id: the ledger keeps one
    record per batch line (its batch and custom id), the first kept."""

    async def scenario(ledger: UsageLedger) -> None:
        first = dataclasses.replace(entry("chatcmpl-1"), batch_line="batch_1/k7")
        again = dataclasses.replace(entry("chatcmpl-2", tokens=30), batch_line="batch_1/k7")
        other_line = dataclasses.replace(entry("chatcmpl-3"), batch_line="batch_1/k8")
        assert await ledger.record(first) and not await ledger.record(again) and await ledger.record(other_line)
        page = await ledger.page("acme", 0, None, 100)
        assert [(r.response_id, r.batch_line) for r in page.records] == [
            ("chatcmpl-1", "batch_1/k7"),
            ("chatcmpl-3", "batch_1/k8"),
        ]

    with_ledger(scenario)


def test_pages_go_through_ten_thousand_records_in_order(with_ledger):
    async def scenario(ledger: UsageLedger) -> None:
        for index in range(10_000):
            await ledger.record(entry(f"resp_{index}", tokens=index))
        seen, after, pages = [], None, 0
        while True:
            page = await ledger.page("acme", 0, after, 1000)
            seen += [r.input_tokens for r in page.records]
            pages += 1
            if not page.has_more:
                break
            after = page.cursors[-1]
        assert seen == list(range(10_000)) and pages == 10
        later = await ledger.page("acme", time.time() + 60, None, 10)  # `since` in the future: none yet
        assert later.records == []

    with_ledger(scenario)


def test_records_past_the_retention_go(with_ledger):
    async def scenario(ledger: UsageLedger) -> None:
        await ledger.record(entry("resp_old"))
        await asyncio.sleep(1.1)
        await ledger.record(entry("resp_new"))
        assert [r.response_id for r in (await ledger.page("acme", 0, None, 10)).records] == ["resp_new"]

    with_ledger(scenario, retention_s=1)


def test_redis_keys_carry_the_tenant_hash_tag_and_the_records_are_sealed_at_rest(redis_server):
    async def scenario() -> None:
        redis_sync.Redis(port=redis_server.port).flushall()
        cipher = RecordCipher([("k1", b"k" * 32)])
        ledger = RedisLedger.from_url(redis_server.url, cipher=cipher)
        try:
            await ledger.record(entry("resp_secret", tenant="acme"))
        finally:
            await ledger.aclose()
        client = redis_sync.Redis(port=redis_server.port)
        keys = sorted(key.decode() for key in client.keys("*"))
        assert len(keys) == 2 and all("{t:" in key for key in keys)
        assert len({key.split("}")[0] for key in keys}) == 1  # one Cluster slot: the script is atomic there
        stream = next(key for key in keys if "records" in key)
        raw = b"".join(value for _, fields in client.xrange(stream) for value in fields.values())
        assert b"resp_secret" not in raw and b"gpt-oss" not in raw

    asyncio.run(scenario())
