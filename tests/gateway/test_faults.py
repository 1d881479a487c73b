"""Faults under load. Redis killed and restarted: streams in flight finish, reads answer a clean 503 and
creates still answer (store: false) while it is down, the gateway recovers without a restart, and every
response acknowledged as stored is there afterwards. A model server that stalls mid-stream: every stream
ends failed at the silence limit with the reason, the upstream requests are aborted, and the gateway
answers whole once the server recovers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import openai
from fake_upstreams import FakeUpstream
from live_gateway import GatewayProcess
from redis_servers import RedisServer
from sse_load import LoadResult, active_streams, run_load

MODEL = "gpt-oss-120b"
SLOW_ANSWER = " ".join(f"word{i}" for i in range(40))
SCRIPT = {
    "rules": [
        {"match": {"user": "slow"}, "token_delay_ms": 40, "emit": [{"final": SLOW_ANSWER}]},
        {"emit": [{"final": "Quick answer."}]},
    ]
}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_redis_killed_under_load_then_restarted(tmp_path):
    # appendfsync always: what Redis acknowledged survives its crash, as a production setup keeps it
    redis = RedisServer(tmp_path / "redis", extra=("--appendonly", "yes", "--appendfsync", "always")).start()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script), "GATEWAY_REDIS_URL": redis.url}
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start()
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-x", max_retries=0)
    try:
        stored_before = [client.responses.create(model=MODEL, input="hi").id for _ in range(10)]
        load: dict[str, LoadResult] = {}
        streams = threading.Thread(target=lambda: load.update(r=asyncio.run(run_load(gateway.url, 40, MODEL, "slow"))))
        streams.start()
        time.sleep(0.6)  # the streams are mid-answer
        redis.kill()

        with_redis_down = client.responses.create(model=MODEL, input="hi")
        assert with_redis_down.status == "completed" and with_redis_down.store is False
        try:
            client.responses.retrieve(stored_before[0])
            raise AssertionError("a read succeeded with Redis down")
        except openai.APIStatusError as error:
            assert error.status_code == 503 and error.body["code"] == "service_unavailable"
        assert _status(gateway.url + "/readyz") == 503
        streams.join(timeout=60)
        result = load["r"]
        assert result.errors == [] and {s.deltas for s in result.streams} == {80}  # every stream finished whole
        assert all(s.response["store"] is False for s in result.streams)  # they ended with Redis down: said so

        redis.start()  # same port, same data directory
        deadline = time.monotonic() + 15
        while _status(gateway.url + "/readyz") != 200:
            assert time.monotonic() < deadline, "the gateway did not recover"
            time.sleep(0.1)
        acknowledged = stored_before + [s.response["id"] for s in result.streams if s.response["store"]]
        for response_id in acknowledged:
            assert client.responses.retrieve(response_id).status == "completed"
        after = client.responses.create(model=MODEL, input="hi")
        assert after.store is True and client.responses.retrieve(after.id).output_text == "Quick answer."
        assert gateway.process.poll() is None  # the same process throughout
    finally:
        gateway.stop()
        redis.stop()


def test_an_upstream_that_stalls_mid_stream_under_load(tmp_path):
    stalling = FakeUpstream("vllm", {"rules": [{"emit": [{"final": SLOW_ANSWER}]}]}, stall_after=8, token_delay_s=0.01)
    stalling.start()
    backend = {"kind": "vllm", "options": {"urls": [stalling.url], "token_timeout_s": 0.5}, "models": [MODEL]}
    env = {"GATEWAY_BACKENDS": json.dumps({"remote": backend}), "GATEWAY_METRICS_PUBLIC": "true"}
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start()
    try:
        began = time.monotonic()
        result = asyncio.run(run_load(gateway.url, 40, MODEL, "hello", timeout_s=60))
        assert time.monotonic() - began < 5  # each stream ends at the silence limit, none hangs
        # every stream answered 200, streamed the tokens that came, then ended failed with the reason
        assert {s.terminal for s in result.streams} == {"response.failed"} and all(
            s.error is None for s in result.streams
        )
        assert all(s.deltas >= 1 for s in result.streams)
        assert {s.response["error"]["message"] for s in result.streams} == {"The model server sent nothing for 0.5 s."}
        # the gateway hung up on every stalled generation, and holds no stream open
        assert stalling.wait_for(lambda: all(call.aborted_at is not None for call in stalling.calls))
        assert len(stalling.calls) == 40 * 3  # each answer continued twice (`retries`) on the one server, in vain
        assert active_streams(gateway.url) == 0

        stalling.stall_after = None  # the model server recovers: the same process answers whole again
        recovered = asyncio.run(run_load(gateway.url, 5, MODEL, "hello", timeout_s=60))
        assert recovered.errors == [] and {s.deltas for s in recovered.streams} == {80}  # the whole answer
    finally:
        gateway.stop()
        stalling.stop()
