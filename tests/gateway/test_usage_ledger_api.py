"""The usage ledger through the public interface, on a live gateway with a real Redis: every finished response
and chat completion (streamed or not, with a tool call or not) leaves one record whose tokens are the `usage`
its client received, with the tenant and the key's id; an admin key pages through them over HTTP and the CLI
exports them; a tenant's key cannot read the ledger, and one tenant's records never appear in another's."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import urllib.error
import urllib.parse
import urllib.request

import openai
import pytest
from gateway_fixtures import KEY_SECRET, WEATHER_TOOL, flush, write_keys, write_script
from live_gateway import LiveGateway

from gateway.config import Settings
from gateway.usage.export import export

ADMIN = "sk-ops"
KEYS = {"sk-tenant-a": "tenant-a", "sk-tenant-b": "tenant-b", ADMIN: "ops"}


@pytest.fixture
def live(tmp_path, redis_server):
    flush(redis_server)
    settings = Settings(
        mock_script=str(write_script(tmp_path)),
        key_secret=KEY_SECRET,
        keys_file=str(write_keys(tmp_path, KEYS)),
        redis_url=redis_server.url,
        admin_tenants=["ops"],
    )
    gateway = LiveGateway(settings).start()
    yield gateway
    gateway.stop()


def _client(live: LiveGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0)


def _records(live: LiveGateway, tenant: str, key: str = ADMIN, **query: str) -> tuple[int, dict]:
    params = urllib.parse.urlencode({"tenant": tenant, **query})
    request = urllib.request.Request(
        f"{live.url}/v1/usage/records?{params}", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read())


def _usage_of_responses(response) -> tuple[int, int, int, int]:
    usage = response.usage
    return (
        usage.input_tokens,
        usage.input_tokens_details.cached_tokens,
        usage.output_tokens,
        usage.output_tokens_details.reasoning_tokens,
    )


def _usage_of_chat(usage) -> tuple[int, int, int, int]:
    return (
        usage.prompt_tokens,
        usage.prompt_tokens_details.cached_tokens,
        usage.completion_tokens,
        usage.completion_tokens_details.reasoning_tokens,
    )


def test_every_finished_answer_leaves_one_record_with_the_usage_its_client_got(live, monkeypatch):
    client = _client(live, "sk-tenant-a")
    expected: dict[str, tuple[tuple[int, int, int, int], str, dict]] = {}
    plain = client.responses.create(model="gpt-oss-120b", input="hello")
    expected[plain.id] = (_usage_of_responses(plain), "responses", {})
    called = client.responses.create(model="gpt-oss-120b", input="weather", tools=[WEATHER_TOOL])
    expected[called.id] = (_usage_of_responses(called), "responses", {"function_call": 1})
    with client.responses.stream(model="gpt-oss-120b", input="hello") as stream:
        streamed = stream.get_final_response()
    expected[streamed.id] = (_usage_of_responses(streamed), "responses", {})
    chat = client.chat.completions.create(model="gpt-oss-120b", messages=[{"role": "user", "content": "hello"}])
    expected[chat.id] = (_usage_of_chat(chat.usage), "chat.completions", {})
    chunks = list(
        client.chat.completions.create(
            model="gpt-oss-120b",
            messages=[{"role": "user", "content": "hello"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    expected[chunks[0].id] = (_usage_of_chat(chunks[-1].usage), "chat.completions", {})
    _client(live, "sk-tenant-b").responses.create(model="gpt-oss-120b", input="hello")  # another tenant's

    status, page = _records(live, "tenant-a")
    assert status == 200 and not page["has_more"]
    records = {row["response_id"]: row for row in page["data"]}
    assert set(records) == set(expected)  # each finished answer once
    for response_id, (usage, api, tools) in expected.items():
        row = records[response_id]
        got = (row["input_tokens"], row["cached_tokens"], row["output_tokens"], row["reasoning_tokens"])
        assert got == usage and row["api"] == api and row["tool_calls"] == tools, response_id
        assert row["tenant"] == "tenant-a" and row["key_id"] == "key_0" and row["status"] == "completed"
        assert row["model"] == "gpt-oss-120b" and row["created_at"] <= row["completed_at"]
    assert sum(row["output_tokens"] for row in records.values()) == sum(u[2] for u, _, _ in expected.values())
    other = _records(live, "tenant-b")[1]["data"]
    assert len(other) == 1 and other[0]["tenant"] == "tenant-b" and other[0]["response_id"] not in records

    first = _records(live, "tenant-a", limit="2")[1]  # pages in order, by cursor
    rest = _records(live, "tenant-a", after=first["last_id"], limit="100")[1]
    assert [r["id"] for r in first["data"] + rest["data"]] == [r["id"] for r in page["data"]] and first["has_more"]

    monkeypatch.setenv("GATEWAY_REDIS_URL", live.services.settings.redis_url)
    out = io.StringIO()
    assert asyncio.run(export("tenant-a", 0, "jsonl", out)) == len(expected)
    assert [json.loads(line)["response_id"] for line in out.getvalue().splitlines()] == list(records)
    table = io.StringIO()
    asyncio.run(export("tenant-a", 0, "csv", table))
    rows = list(csv.DictReader(io.StringIO(table.getvalue())))
    assert [int(row["output_tokens"]) for row in rows] == [r["output_tokens"] for r in records.values()]


def test_only_admin_keys_read_the_ledger_and_bad_queries_name_their_parameter(live):
    _client(live, "sk-tenant-a").responses.create(model="gpt-oss-120b", input="hello")
    status, body = _records(live, "tenant-a", key="sk-tenant-a")
    assert status == 403 and body["error"]["code"] == "insufficient_permissions"
    for query, param in (({"limit": "0"}, "limit"), ({"after": "x"}, "after"), ({"since": "-1"}, "since")):
        status, body = _records(live, "tenant-a", **query)
        assert status == 400 and body["error"]["param"] == param, query
    status, body = _records(live, "not a tenant")
    assert status == 400 and body["error"]["param"] == "tenant"
