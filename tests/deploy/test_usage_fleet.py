"""The usage ledger across a fleet: three `serve` replicas on one redis-server take 200 requests of mixed kinds
(Responses and Chat Completions, streamed and not, a tool call among them) from two tenants, and one replica is
SIGKILLed a third of the way through. Every answer a client received whole has exactly one record, with the
usage the client received; the only other records are of requests the kill cut (billed before their end went
out); each tenant's export holds only its own; the admin export pages through them all."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
from gateway_fixtures import KEY_SECRET, WEATHER_TOOL, write_keys
from live_gateway import GatewayProcess
from redis_servers import RedisServer

MODEL = "gpt-oss-120b"
SCRIPT = {
    "rules": [
        {
            "match": {"user": "weather"},
            "emit": [{"analysis": "Call it."}, {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"token_delay_ms": 15, "emit": [{"analysis": "Answer in a few words."}, {"final": "ok then, done here"}]},
    ]
}
KEYS = {"sk-acme": "acme", "sk-beta": "beta", "sk-ops": "ops"}
REQUESTS = 200


def _one(url: str, key: str, kind: int) -> tuple[str, tuple[int, int, int, int]]:
    """(response id, usage as the client received it) for one request of kind `kind`; raises when cut."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    if kind == 0:
        response = client.responses.create(model=MODEL, input="hello")
    elif kind == 1:
        response = client.responses.create(model=MODEL, input="weather", tools=[WEATHER_TOOL])
    elif kind == 2:
        with client.responses.stream(model=MODEL, input="hello") as stream:
            response = stream.get_final_response()
    else:
        messages = [{"role": "user", "content": "hello"}]
        if kind == 3:
            chat = client.chat.completions.create(model=MODEL, messages=messages)
            usage, chat_id = chat.usage, chat.id
        else:
            chunks = list(
                client.chat.completions.create(
                    model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
                )
            )
            usage, chat_id = chunks[-1].usage, chunks[0].id
            assert usage is not None  # the stream ran to its end
        details = (usage.prompt_tokens_details.cached_tokens, usage.completion_tokens_details.reasoning_tokens)
        return chat_id, (usage.prompt_tokens, details[0], usage.completion_tokens, details[1])
    usage = response.usage
    cached, reasoning = usage.input_tokens_details.cached_tokens, usage.output_tokens_details.reasoning_tokens
    return response.id, (usage.input_tokens, cached, usage.output_tokens, reasoning)


def _export(url: str, tenant: str) -> list[dict]:
    rows, after = [], None
    while True:
        query = {"tenant": tenant, "limit": 50, **({"after": after} if after else {})}
        request = urllib.request.Request(
            f"{url}/v1/usage/records?{urllib.parse.urlencode(query)}", headers={"Authorization": "Bearer sk-ops"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            page = json.loads(response.read())
        rows += page["data"]
        if not page["has_more"]:
            return rows
        after = page["last_id"]


def test_each_answer_a_client_received_has_one_record_across_replicas_and_a_kill(tmp_path):
    redis = RedisServer(tmp_path / "redis").start()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {
        "GATEWAY_REDIS_URL": redis.url,
        "GATEWAY_MOCK_SCRIPT": str(script),
        "GATEWAY_MODELS": MODEL,
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(tmp_path, KEYS)),
        "GATEWAY_ADMIN_TENANTS": "ops",
        "GATEWAY_REASONING_KEYS": "k1:" + "A" * 43 + "=",
    }
    replicas = [GatewayProcess(env, tmp_path / f"replica-{i}.log").start() for i in range(3)]
    received: dict[str, tuple[str, tuple[int, int, int, int]]] = {}  # response id → (tenant, usage)
    cut: list[str] = []
    lock, done = threading.Lock(), threading.Semaphore(0)
    rng = random.Random(7)
    plan = [(i % 3, ("acme", "beta")[i % 2], rng.randrange(5)) for i in range(REQUESTS)]

    def send(replica: int, tenant: str, kind: int) -> None:
        try:
            response_id, usage = _one(replicas[replica].url, f"sk-{tenant}", kind)
            with lock:
                assert response_id not in received
                received[response_id] = (tenant, usage)
        except Exception as exc:  # the killed replica's requests: refused or cut
            with lock:
                cut.append(f"{replica}: {type(exc).__name__}")
        finally:
            done.release()

    try:
        with ThreadPoolExecutor(12) as pool:
            for request in plan:
                pool.submit(send, *request)
            for _ in range(REQUESTS // 3):
                done.acquire(timeout=60)
            replicas[2].process.kill()  # mid-run: its answers in flight are cut
            replicas[2].process.wait(timeout=10)
        time.sleep(0.5)  # records still being written by the live replicas' last requests
        records = {tenant: _export(replicas[0].url, tenant) for tenant in ("acme", "beta")}
    finally:
        for replica in replicas:
            replica.stop()
        redis.stop()

    assert len(received) + len(cut) == REQUESTS and cut and all(c.startswith("2:") for c in cut)
    for tenant, rows in records.items():
        assert all(row["tenant"] == tenant for row in rows)
        ids = [row["response_id"] for row in rows]
        assert len(ids) == len(set(ids)), "a response recorded twice"
        mine = {rid: usage for rid, (owner, usage) in received.items() if owner == tenant}
        by_id = {row["response_id"]: row for row in rows}
        missing = set(mine) - set(by_id)
        assert not missing, f"{len(missing)} answers received whole have no record"
        for rid, usage in mine.items():
            row = by_id[rid]
            assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"], row["reasoning_tokens"]) == usage
        extra = set(by_id) - set(mine)
        assert len(extra) <= len(cut), "records of answers nobody was sent"
        totals = [sum(u[i] for u in mine.values()) for i in range(4)]
        fields = ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")
        assert [sum(by_id[rid][name] for rid in mine) for name in fields] == totals
