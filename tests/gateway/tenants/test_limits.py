"""Per-tenant limits through the API: rates with exact Retry-After, token reservations, concurrency, caps,
shared across replicas by Redis (standalone and Cluster), and the policy when Redis is unreachable."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from gateway_fixtures import KEY_SECRET, flush, write_keys, write_script
from live_gateway import GatewayProcess, LiveGateway
from redis_servers import free_port, start_cluster

from gateway.config import Settings
from gateway.tenants.limits import LimitsConfig
from state.limiter import MemoryLimiter, RedisLimiter

MODEL = "gpt-oss-120b"
KEYS = {"sk-small": "small", "sk-big": "big"}


def _gateway(tmp_path, limits: dict, **settings) -> LiveGateway:
    base = Settings(
        mock_script=str(write_script(tmp_path)),
        key_secret=KEY_SECRET,
        keys_file=str(write_keys(tmp_path, KEYS)),
        limits=limits,
        **settings,
    )
    return LiveGateway(base).start()


def _client(live, key: str = "sk-small") -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=30)


def _post(url: str, body: dict, key: str | None = None) -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + "/v1/responses", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_requests_per_minute_with_an_exact_retry_after(tmp_path):
    live = _gateway(tmp_path, {"tenants": {"small": {"requests_per_minute": 3}}})
    try:
        for _ in range(3):
            assert _post(live.url, {"model": MODEL, "input": "hi"}, "sk-small")[0] == 200
        status, headers, body = _post(live.url, {"model": MODEL, "input": "hi"}, "sk-small")
        assert status == 429 and body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "requests"
        wait_ms = int(headers["retry-after-ms"])
        assert 15_000 < wait_ms <= 20_000  # 3 a minute: the next one is due 20 s after the first
        assert int(headers["Retry-After"]) == -(-wait_ms // 1000)
        assert headers["x-ratelimit-limit-requests"] == "3" and headers["x-ratelimit-remaining-requests"] == "0"
        assert _post(live.url, {"model": MODEL, "input": "hi"}, "sk-big")[0] == 200  # other tenants are not held
        with pytest.raises(openai.RateLimitError):
            _client(live).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    finally:
        live.stop()


def test_tokens_are_reserved_on_admission_and_the_unused_part_refunded(tmp_path):
    live = _gateway(tmp_path, {"tenants": {"small": {"tokens_per_minute": 1500}}})
    try:
        api = _client(live)
        for _ in range(2):  # each reserves prompt + 1200 (two do not fit in 1500) and uses far less: refunded
            response = api.responses.create(model=MODEL, input="hi", max_output_tokens=1200)
            assert response.usage.total_tokens < 300
        with pytest.raises(openai.RateLimitError) as info:
            api.responses.create(model=MODEL, input="hi", max_output_tokens=1600)
        assert "Request too large" in info.value.message
    finally:
        live.stop()


def test_concurrent_streams_are_capped(tmp_path):
    live = _gateway(tmp_path, {"tenants": {"small": {"concurrent_streams": 1, "concurrent_requests": 2}}})
    try:
        api = _client(live)
        started = threading.Event()

        def slow_stream() -> None:
            for event in api.responses.create(model=MODEL, input="go slowly", stream=True):
                if event.type == "response.output_text.delta" or "reasoning" in event.type:
                    started.set()

        worker = threading.Thread(target=slow_stream)
        worker.start()
        assert started.wait(10)
        with pytest.raises(openai.RateLimitError) as info:
            list(api.responses.create(model=MODEL, input="hi", stream=True))
        assert info.value.body["code"] == "concurrency_limit_exceeded"
        assert api.responses.create(model=MODEL, input="hi").status == "completed"  # 2 generations may run
        worker.join(30)
        assert list(api.responses.create(model=MODEL, input="hi", stream=True))[-1].type == "response.completed"
    finally:
        live.stop()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_output_tokens": 600}, "max_output_tokens"),
        ({"input": [{"role": "user", "content": "a"}] * 5}, "input"),
        ({"tools": [{"type": "function", "name": f"f{i}"} for i in range(3)]}, "tools"),
        (
            {"text": {"format": {"type": "json_schema", "name": "s", "schema": {"description": "x" * 600}}}},
            "text.format.schema",
        ),
    ],
)
def test_size_caps_name_the_parameter(tmp_path, body, param):
    caps = {"max_output_tokens": 500, "max_input_items": 4, "max_tools": 2, "max_schema_bytes": 512}
    live = _gateway(tmp_path, {"default": caps, "tenants": {"big": {"max_output_tokens": 5000}}})
    try:
        status, _, answer = _post(live.url, {"model": MODEL, "input": "hi", **body}, "sk-small")
        assert (status, answer["error"]["param"]) == (400, param)
        if param == "max_output_tokens":
            assert _post(live.url, {"model": MODEL, "input": "hi", **body}, "sk-big")[0] == 200  # override
    finally:
        live.stop()


def test_a_tenant_body_cap_is_a_413(tmp_path):
    live = _gateway(tmp_path, {"tenants": {"small": {"max_body_bytes": 1000}}})
    try:
        status, _, answer = _post(live.url, {"model": MODEL, "input": "x" * 2000}, "sk-small")
        assert status == 413 and answer["error"]["code"] == "body_too_large"
        assert _post(live.url, {"model": MODEL, "input": "x" * 2000}, "sk-big")[0] == 200
    finally:
        live.stop()


def test_a_limit_holds_across_two_processes_sharing_redis(redis_server, tmp_path):
    flush(redis_server)
    env = {
        "GATEWAY_REDIS_URL": redis_server.url,
        "GATEWAY_MOCK_SCRIPT": str(write_script(tmp_path)),
        "GATEWAY_LIMITS": json.dumps({"default": {"requests_per_minute": 6}}),
    }
    replicas = [GatewayProcess(env, tmp_path / f"replica{i}.log").start() for i in range(2)]
    try:
        outcomes = [_post(replicas[i % 2].url, {"model": MODEL, "input": "hi"}) for i in range(12)]
    finally:
        for replica in replicas:
            replica.stop()
    statuses = [status for status, _, _ in outcomes]
    assert statuses.count(200) == 6 and statuses.count(429) == 6
    assert statuses[:6] == [200] * 6
    waits = [int(headers["retry-after-ms"]) for status, headers, _ in outcomes if status == 429]
    assert all(8_000 < wait <= 10_000 for wait in waits)  # 6 a minute: one every 10 s


def test_the_same_scripts_run_on_a_redis_cluster(tmp_path):
    nodes = start_cluster(tmp_path)

    async def scenario() -> None:
        limiter = RedisLimiter.from_url(f"redis+cluster://127.0.0.1:{nodes[0].port}")
        try:
            for tenant in ("a", "b", "c", "d"):  # tenants hash to different slots and nodes
                decisions = [await limiter.charge(tenant, "rpm", 2, 2, 1) for _ in range(3)]
                assert [d.admitted for d in decisions] == [True, True, False]
                assert 29 < decisions[2].retry_after_s <= 30
                assert await limiter.lease(tenant, "streams", 1, "one", 30)
                assert not await limiter.lease(tenant, "streams", 1, "two", 30)
                await limiter.release(tenant, "streams", "one")
                assert await limiter.lease(tenant, "streams", 1, "two", 30)
                await limiter.charge(tenant, "tpm", 60, 60, 50)
                await limiter.charge(tenant, "tpm", 60, 60, -40)  # a refund
                assert (await limiter.charge(tenant, "tpm", 60, 60, 45)).admitted
        finally:
            await limiter.aclose()

    try:
        asyncio.run(scenario())
    finally:
        for node in nodes:
            node.stop()


@pytest.mark.parametrize(("policy", "third"), [("local", 429), ("open", 200), ("closed", 503)])
def test_the_policy_when_redis_is_unreachable(tmp_path, policy, third):
    limits = {"default": {"requests_per_minute": 2}, "on_store_failure": policy}
    settings = Settings(
        mock_script=str(write_script(tmp_path)), redis_url=f"redis://127.0.0.1:{free_port()}", limits=limits
    )
    live = LiveGateway(settings).start()
    try:
        statuses = [_post(live.url, {"model": MODEL, "input": "hi", "store": False})[0] for _ in range(3)]
    finally:
        live.stop()
    assert statuses == ([503] * 3 if policy == "closed" else [200, 200, third])


def test_memory_and_redis_limiters_agree(redis_server):
    flush(redis_server)

    async def run(limiter) -> list[tuple[bool, int]]:
        out = []
        for cost in (3, 3, 3, -2, 3, 5):
            decision = await limiter.charge("t", "tpm", 600, 10, cost)
            out.append((decision.admitted, round(decision.retry_after_s)))
        return out

    async def both() -> None:
        redis_limiter = RedisLimiter.from_url(redis_server.url)
        try:
            assert await run(MemoryLimiter()) == await run(redis_limiter)
        finally:
            await redis_limiter.aclose()

    asyncio.run(both())


def test_a_concurrency_slot_outlives_its_lease_ttl_while_the_generation_runs(tmp_path):
    live = _gateway(tmp_path, {"tenants": {"small": {"concurrent_streams": 1}}, "lease_ttl_s": 1.2})
    try:
        api = _client(live)
        started = threading.Event()

        def slow_stream() -> None:
            for _ in api.responses.create(model=MODEL, input="go slowly", stream=True):
                started.set()

        worker = threading.Thread(target=slow_stream)
        worker.start()
        assert started.wait(10)
        time.sleep(1.5)  # past the lease's ttl: only its renewal keeps the slot taken
        assert worker.is_alive()
        with pytest.raises(openai.RateLimitError):
            list(api.responses.create(model=MODEL, input="hi", stream=True))
        worker.join(30)
    finally:
        live.stop()


def test_background_responses_are_capped_per_tenant_by_default(tmp_path):
    assert LimitsConfig().for_tenant("anyone").concurrent_background == 64  # on unless set to null
    live = _gateway(tmp_path, {"default": {"concurrent_background": 2}})
    try:
        api = _client(live)
        running = [api.responses.create(model=MODEL, input="go slowly", background=True) for _ in range(2)]
        with pytest.raises(openai.RateLimitError) as refused:
            api.responses.create(model=MODEL, input="go slowly", background=True)
        assert "background responses" in refused.value.message
        assert api.responses.create(model=MODEL, input="hi").status == "completed"  # foreground is not capped
        api.responses.cancel(running[0].id)
        assert api.responses.create(model=MODEL, input="hi", background=True).status == "queued"
    finally:
        live.stop()
