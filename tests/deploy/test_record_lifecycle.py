"""A stored response's life across replicas (real `serve` processes on one redis-server): DELETE is final
even while the response runs, a final save that meets Redis down lands when it is back, a replica that
dies leaves records that read as failed within the lease, and every kind of Redis failure is an
OpenAI-shaped answer, never a 500 or a cut stream."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
import redis as redis_sync
from gateway_fixtures import ANALYSIS_WEATHER, LONG_TEXT, TEST_KEYS, WEATHER_TOOL
from live_gateway import GatewayProcess
from redis_servers import RedisServer

MODEL = "gpt-oss-120b"
LEASE_S = 1.5
SCRIPT = {
    "rules": [
        {
            "match": {"user": "weather"},
            "emit": [{"analysis": ANALYSIS_WEATHER}, {"tool_call": {"name": "get_weather", "arguments": {"c": 1}}}],
        },
        {"match": {"prompt": re.escape(ANALYSIS_WEATHER)}, "emit": [{"final": "saw-cot"}]},
        {"match": {"user": "slowly"}, "token_delay_ms": 25, "emit": [{"analysis": LONG_TEXT}, {"final": "late"}]},
        {"emit": [{"final": "no-cot"}]},
    ]
}


def _start(tmp_path, redis: RedisServer, names: tuple[str, ...], **env: str) -> list[GatewayProcess]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    base = {"GATEWAY_REDIS_URL": redis.url, "GATEWAY_MOCK_SCRIPT": str(script), "GATEWAY_RECORD_LEASE_S": str(LEASE_S)}
    return [GatewayProcess({**base, **env}, tmp_path / f"{name}.log").start() for name in names]


def _client(process: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=process.url + "/v1", api_key="sk-shared", max_retries=0, timeout=30)


def _wait_for(predicate, timeout_s: float = 10.0, step_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    raise AssertionError("condition not reached in time")


def _keys(redis: RedisServer, kind: str) -> list[bytes]:
    return redis_sync.Redis(port=redis.port).keys(f"gw:*:{kind}:*")


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def pair(tmp_path, redis):
    processes = _start(tmp_path, redis, ("a", "b"))
    yield processes
    for process in processes:
        process.stop()


def test_a_stream_deleted_on_another_replica_stays_deleted(pair, redis):
    a, b = (_client(p) for p in pair)
    events = []
    with a.responses.create(model=MODEL, input="answer slowly", stream=True) as stream:
        for event in stream:
            events.append(event)
            if len(events) == 3:  # mid-answer: delete it through the other replica
                b.responses.delete(events[0].response.id)
    response_id = events[0].response.id
    assert events[-1].type == "error"  # the owner saw the tombstone and stopped, with a terminal event
    assert [e.type for e in events].count("response.completed") == 0
    time.sleep(0.3)
    for client in (a, b):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response_id)
    assert _keys(redis, "resp") == []


def test_a_background_response_deleted_while_running_is_not_written_back(pair, redis):
    a, b = (_client(p) for p in pair)
    for deleter in (a, b):  # on its own replica (the run is cancelled) and on the other (the run sees it)
        started = a.responses.create(model=MODEL, input="answer slowly", background=True)
        _wait_for(lambda started=started: b.responses.retrieve(started.id).status == "in_progress")
        deleter.responses.delete(started.id)
        time.sleep(LEASE_S + 1.0)  # past the owner's next renewal and any final save
        for client in (a, b):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(started.id)
    assert _keys(redis, "resp") == []


def test_delete_removes_the_chain_of_thought_indexed_by_call_id(pair, redis):
    a, b = (_client(p) for p in pair)

    def chat_replay(client: openai.OpenAI, call) -> str:
        messages = [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
        ]
        tools = [{"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}]
        return client.chat.completions.create(model=MODEL, messages=messages, tools=tools).choices[0].message.content

    first = a.responses.create(model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL])
    call = first.output[-1]
    assert chat_replay(b, call) == "saw-cot"  # recovered by call id on the other replica
    b.responses.delete(first.id)
    assert chat_replay(a, call) == "no-cot"
    assert _keys(redis, "cot") == []


def test_a_background_result_finished_while_redis_was_down_lands_when_it_is_back(tmp_path, redis):
    (gateway,) = _start(tmp_path, redis, ("a",))
    try:
        api = _client(gateway)
        started = api.responses.create(model=MODEL, input="answer slowly", background=True)
        _wait_for(lambda: api.responses.retrieve(started.id).status == "in_progress")
        redis.stop()  # no persistence: the record is gone with it; the run finishes while Redis is down
        time.sleep(7.0)
        redis.start()
        final = _wait_for(lambda: _retrieve_or_none(api, started.id), timeout_s=15)
        assert final.status == "completed" and final.output_text == "late" and final.store is True
        assert "final_save_landed" in gateway.log_text()
    finally:
        gateway.stop()


def test_a_stream_whose_final_save_fails_says_store_false_and_its_record_does_not_stay_running(tmp_path, redis):
    (gateway,) = _start(tmp_path, redis, ("a",))
    try:
        api = _client(gateway)
        events = []
        with api.responses.create(model=MODEL, input="answer slowly", stream=True) as stream:
            for event in stream:
                events.append(event)
                if len(events) == 3:
                    redis.stop()
                    threading.Timer(8.0, redis.start).start()
        assert events[-1].type == "response.completed" and events[-1].response.store is False
        final = _wait_for(lambda: _retrieve_or_none(api, events[0].response.id), timeout_s=20)
        assert final.status == "completed" and final.store is False  # as the stream said; not in_progress
    finally:
        gateway.stop()


def _retrieve_or_none(api: openai.OpenAI, response_id: str):
    try:
        return api.responses.retrieve(response_id)
    except (openai.NotFoundError, openai.InternalServerError):  # 503 while Redis is down, 404 before the save
        return None


def test_a_killed_replica_leaves_records_that_read_as_failed_within_the_lease(tmp_path, redis):
    a, b = _start(tmp_path, redis, ("a", "b"))
    try:
        api_a, api_b = _client(a), _client(b)
        started = api_a.responses.create(model=MODEL, input="answer slowly", background=True)
        _wait_for(lambda: api_b.responses.retrieve(started.id).status == "in_progress")
        a.process.send_signal(signal.SIGKILL)
        a.process.wait(5)
        killed_at = time.monotonic()
        orphan = _wait_for(lambda: (r := api_b.responses.retrieve(started.id)).status == "failed" and r)
        assert time.monotonic() - killed_at < LEASE_S + 0.5
        assert orphan.error.code == "server_error" and "stopped" in orphan.error.message
        follow_up = api_b.responses.create(model=MODEL, previous_response_id=started.id, input="thanks")
        assert follow_up.status == "completed"  # not 400 "still in_progress"
        with pytest.raises(openai.BadRequestError):
            api_b.responses.cancel(started.id)  # already failed
    finally:
        a.stop()
        b.stop()


def test_redis_out_of_memory_is_store_false_a_whole_stream_and_an_unready_replica(tmp_path):
    full = RedisServer(tmp_path / "full", extra=("--maxmemory-policy", "noeviction")).start()
    limits = json.dumps({"default": {"requests_per_minute": 1000}, "on_store_failure": "local"})
    (gateway,) = _start(tmp_path, full, ("a",), GATEWAY_LIMITS=limits)
    try:
        api = _client(gateway)
        kept = api.responses.create(model=MODEL, input="hi")
        ballast = redis_sync.Redis(port=full.port)
        ballast.set("ballast", b"x" * 2_000_000)
        ballast.config_set("maxmemory", "1mb")  # far below what it holds: writes refused
        plain = api.responses.create(model=MODEL, input="hi")  # limits count locally; the answer is not stored
        assert plain.status == "completed" and plain.store is False
        events = list(api.responses.create(model=MODEL, input="hi", stream=True))
        assert events[-1].type == "response.completed" and events[-1].response.store is False
        assert api.responses.retrieve(kept.id).id == kept.id  # reads still work
        with pytest.raises(urllib.error.HTTPError) as unready:
            urllib.request.urlopen(gateway.url + "/readyz", timeout=5)
        assert unready.value.code == 503 and "out of memory" in json.load(unready.value)["store"]
        with pytest.raises(openai.InternalServerError) as refused:  # 503: a background answer cannot be kept
            api.responses.create(model=MODEL, input="hi", background=True)
        assert refused.value.status_code == 503
        assert "Traceback" not in gateway.log_text()
    finally:
        gateway.stop()
        full.stop()


def test_records_and_indexed_cot_are_encrypted_at_rest(tmp_path, redis):
    keys = {"GATEWAY_STORE_ENCRYPTION": "true", "GATEWAY_REASONING_KEYS": TEST_KEYS}
    a, b = _start(tmp_path, redis, ("a", "b"), **keys)
    (plain,) = _start(tmp_path, redis, ("plain",))
    try:
        first = _client(a).responses.create(model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL])
        call = first.output[-1]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        second = _client(b).responses.create(
            model=MODEL, previous_response_id=first.id, input=[output], tools=[WEATHER_TOOL]
        )
        assert second.output_text == "saw-cot"  # the other replica opened the record and its CoT
        client = redis_sync.Redis(port=redis.port)
        values = [client.get(key) for key in client.keys("gw:*") if client.type(key) == b"string"]
        stored = [value for value in values if value not in (b"1",)]  # leases, tombstones, health are flags
        assert stored and all(value[:1] == b"E" for value in stored)
        assert not any(ANALYSIS_WEATHER.encode() in value or b"Paris" in value for value in stored)
        with pytest.raises(openai.InternalServerError) as refused:  # a replica without the keys: 503, not 500
            _client(plain).responses.retrieve(first.id)
        assert refused.value.status_code == 503
    finally:
        for process in (a, b, plain):
            process.stop()
