"""Streaming a background response again with the SDK (`responses.retrieve(id, stream=True,
starting_after=N)`): a finished one replays its events, a running one is followed to its end, on the
memory store and across two `serve` processes on one redis-server; every event validates against the SDK's
pydantic models and the sequence numbers run on without a gap."""

from __future__ import annotations

import json
import time

import openai
import pytest
import redis as redis_sync
from gateway_fixtures import TEST_KEYS
from live_gateway import GatewayProcess, LiveGateway
from pydantic import TypeAdapter
from redis_servers import RedisServer

from gateway.config import Settings

MODEL = "gpt-oss-120b"
STEPS = " ".join(f"step{i}" for i in range(40))
SCRIPT = {
    "rules": [
        {"match": {"user": "slowly"}, "token_delay_ms": 20, "emit": [{"analysis": STEPS}, {"final": "done slowly"}]},
        {"emit": [{"analysis": "short"}, {"final": "done"}]},
    ]
}
EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)


def _events(stream) -> list:
    return [EVENT.validate_python(event.model_dump(by_alias=True, exclude_unset=True)) for event in stream]


def _text(events) -> str:
    return "".join(event.delta for event in events if event.type == "response.output_text.delta")


def _wait_done(api: openai.OpenAI, response_id: str) -> None:
    deadline = time.monotonic() + 20
    while api.responses.retrieve(response_id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture
def api(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    live = LiveGateway(Settings(mock_script=str(script))).start()
    yield openai.OpenAI(base_url=live.url + "/v1", api_key="sk-a", max_retries=0, timeout=30)
    live.stop()


def test_a_finished_background_response_replays_its_events_after_n(api):
    created = api.responses.create(model=MODEL, input="hi", background=True)
    _wait_done(api, created.id)
    everything = _events(api.responses.retrieve(created.id, stream=True))
    assert [event.sequence_number for event in everything] == list(range(len(everything)))
    assert everything[0].type == "response.created" and everything[-1].type == "response.completed"
    assert _text(everything) == "done" == everything[-1].response.output_text
    later = _events(api.responses.retrieve(created.id, stream=True, starting_after=5))
    assert [event.sequence_number for event in later] == list(range(6, len(everything)))


def test_a_running_background_response_is_followed_to_its_end(api):
    created = api.responses.create(model=MODEL, input="answer slowly", background=True)
    first = _events(api.responses.retrieve(created.id, stream=True))
    assert first[-1].type == "response.completed" and _text(first) == "done slowly"
    assert [event.sequence_number for event in first] == list(range(len(first)))


def test_only_background_responses_stream_again_and_bad_positions_are_400(api):
    plain = api.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        list(api.responses.retrieve(plain.id, stream=True))
    assert caught.value.body["param"] == "stream"
    background = api.responses.create(model=MODEL, input="hi", background=True)
    for bad in ("x", "-2", str(2**64), str(2**63), "9" * 5000):  # past any sequence number: a 400, not a stream
        with pytest.raises(openai.BadRequestError) as caught:
            list(api.responses.retrieve(background.id, stream=True, extra_query={"starting_after": bad}))
        assert caught.value.body["param"] == "starting_after"
    _wait_done(api, background.id)
    api.responses.delete(background.id)
    with pytest.raises(openai.NotFoundError):
        list(api.responses.retrieve(background.id, stream=True))


def test_streaming_again_works_on_another_replica_and_delete_removes_the_events(tmp_path):
    """With encryption at rest, as the stored records: no answer text lies in Redis in the clear."""
    redis = RedisServer(tmp_path / "redis").start()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {
        "GATEWAY_REDIS_URL": redis.url,
        "GATEWAY_MOCK_SCRIPT": str(script),
        "GATEWAY_STORE_ENCRYPTION": "true",
        "GATEWAY_REASONING_KEYS": TEST_KEYS,
    }
    replicas = [GatewayProcess(env, tmp_path / f"{name}.log").start() for name in ("a", "b")]
    try:
        a, b = (openai.OpenAI(base_url=r.url + "/v1", api_key="sk-a", max_retries=0, timeout=30) for r in replicas)
        created = a.responses.create(model=MODEL, input="answer slowly", background=True)
        time.sleep(0.3)  # running on a: b follows it through Redis
        followed = _events(b.responses.retrieve(created.id, stream=True, starting_after=2))
        assert followed[0].sequence_number == 3 and followed[-1].type == "response.completed"
        assert [e.sequence_number for e in followed] == list(range(3, 3 + len(followed)))
        assert followed[-1].response.output_text == "done slowly"
        replay = _events(a.responses.retrieve(created.id, stream=True))
        assert [e.model_dump() for e in replay[3:]] == [e.model_dump() for e in followed]
        client = redis_sync.Redis(port=redis.port)
        (stream,) = client.keys("gw:*:ev:*")
        entries = client.xrange(stream)
        assert 0 < client.ttl(stream) <= 30 * 24 * 3600  # the store's TTL (30 days by default)
        assert len(entries) == len(replay) and not any(b"slowly" in fields[b"e"] for _, fields in entries)
        b.responses.delete(created.id)
        assert client.keys("gw:*:ev:*") == []
    finally:
        for replica in replicas:
            replica.stop()
        redis.stop()


def test_a_dead_replicas_response_streamed_again_ends_with_the_records_failure(tmp_path):
    """Followed from another replica while its own replica is SIGKILLed: the events the dead replica kept are
    replayed, and the stream ends, once the lease has run out, with the record's own response.failed."""
    redis = RedisServer(tmp_path / "redis").start()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [{"token_delay_ms": 200, "emit": [{"final": STEPS}]}]}))
    env = {"GATEWAY_REDIS_URL": redis.url, "GATEWAY_MOCK_SCRIPT": str(script), "GATEWAY_RECORD_LEASE_S": "1.5"}
    replicas = [GatewayProcess(env, tmp_path / f"{name}.log").start() for name in ("a", "b")]
    try:
        a, b = (openai.OpenAI(base_url=r.url + "/v1", api_key="sk-a", max_retries=0, timeout=60) for r in replicas)
        created = a.responses.create(model=MODEL, input="hi", background=True)
        time.sleep(0.6)
        replicas[0].process.kill()
        events = _events(b.responses.retrieve(created.id, stream=True))
        assert events[0].type == "response.created" and events[-1].type == "response.failed"
        assert "stopped" in events[-1].response.error.message
        assert [e.sequence_number for e in events] == list(range(len(events)))
    finally:
        for replica in replicas:
            replica.stop()
        redis.stop()
