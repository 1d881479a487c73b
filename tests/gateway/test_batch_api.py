"""The Files and Batch APIs through the `openai` SDK against live gateways (in-memory and on a real Redis): files
uploaded, listed, read and deleted per tenant; batches of Chat Completions and Responses requests run at the flex
tier to an output file of OpenAI's line shape, with failures in the error file; a file with duplicate ids fails
with the lines named; a cancel ends a batch with what finished; another tenant sees none of it; and a replica
killed mid-batch leaves the batch to another that finishes it with each line's result once."""

from __future__ import annotations

import io
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from gateway_fixtures import KEY_SECRET, SCRIPT, TEST_KEYS, flush, gateway_settings, write_keys, write_script
from live_gateway import GatewayProcess, LiveGateway

from gateway.batches import batches_api
from state.files import CHUNK_BYTES

MODEL = "gpt-oss-120b"


@pytest.fixture(params=["memory", "redis"])
def live(request, tmp_path):
    settings = gateway_settings(
        tmp_path, {**SCRIPT, "service_tiers": True}, batch_poll_s=0.1, files_max_bytes=200_000,
        files_tenant_bytes=400_000, admin_tenants=["tenant-a"],
    )  # fmt: skip
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        flush(server)
        settings = settings.model_copy(update={"redis_url": server.url})
    gateway = LiveGateway(settings).start()
    yield gateway
    gateway.stop()


def _client(live, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0, timeout=30)


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _chat_line(custom_id: str, text: str = "thanks", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": text}], **body},
    }


def _wait(client: openai.OpenAI, batch_id: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


def _lines(client: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines()]


def test_files_are_kept_read_listed_and_deleted_per_tenant(live):
    a, b = _client(live), _client(live, "sk-tenant-b")
    content = _jsonl([_chat_line(f"r{i}") for i in range(3)])
    uploaded = a.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch")
    assert uploaded.object == "file" and uploaded.purpose == "batch" and uploaded.bytes == len(content)
    assert uploaded.filename == "input.jsonl" and uploaded.status == "processed"
    assert uploaded.expires_at == uploaded.created_at + 30 * 24 * 3600
    assert a.files.retrieve(uploaded.id).id == uploaded.id
    assert a.files.content(uploaded.id).content == content
    assert [f.id for f in a.files.list()] == [uploaded.id]
    assert [f.id for f in a.files.list(purpose="batch_output")] == []
    for call in (lambda: b.files.retrieve(uploaded.id), lambda: b.files.content(uploaded.id).content,
                 lambda: b.files.delete(uploaded.id)):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(b.files.list()) == []
    with pytest.raises(openai.NotFoundError):
        b.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    deleted = a.files.delete(uploaded.id)
    assert deleted.deleted is True and deleted.id == uploaded.id
    with pytest.raises(openai.NotFoundError):
        a.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        a.files.delete(uploaded.id)


def test_uploads_are_checked_and_bounded(live):
    a = _client(live)
    with pytest.raises(openai.BadRequestError) as caught:
        a.files.create(file=("x.jsonl", io.BytesIO(_jsonl([_chat_line("r")]))), purpose="assistants")
    assert caught.value.body["param"] == "purpose"
    with pytest.raises(openai.BadRequestError) as caught:
        a.files.create(file=("x.jsonl", io.BytesIO(b'{"custom_id": "a"}\nnot json\n')), purpose="batch")
    assert caught.value.body["param"] == "file" and "Line 2" in caught.value.body["message"]
    with pytest.raises(openai.APIStatusError) as caught:  # over the 200,000 bytes of one file
        a.files.create(file=("x.jsonl", io.BytesIO(_jsonl([_chat_line("r", "x" * 250_000)]))), purpose="batch")
    assert caught.value.status_code == 413 and caught.value.body["param"] == "file"
    with pytest.raises(openai.BadRequestError) as caught:
        a.files.create(
            file=("x.jsonl", io.BytesIO(_jsonl([_chat_line("r")]))),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 60},
        )
    assert caught.value.body["param"] == "expires_after.seconds"
    big = _jsonl([_chat_line("r", "y" * 150_000)])  # two of these pass the tenant's 400,000 bytes
    first = a.files.create(file=("a.jsonl", io.BytesIO(big)), purpose="batch")
    a.files.create(file=("b.jsonl", io.BytesIO(big)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as caught:
        a.files.create(file=("c.jsonl", io.BytesIO(big)), purpose="batch")
    assert caught.value.body["code"] == "file_storage_limit_exceeded"
    a.files.delete(first.id)  # a delete gives the room back
    a.files.create(file=("c.jsonl", io.BytesIO(big)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as caught:
        a.batches.create(input_file_id=first.id, endpoint="/v1/embeddings", completion_window="24h")
    assert caught.value.body["param"] == "endpoint"


def test_a_chat_batch_runs_at_flex_to_an_output_and_an_error_file(live):
    a = _client(live)
    lines = [_chat_line(f"r{i}", "thanks") for i in range(6)]
    lines.append(_chat_line("bad", "thanks", temperature=9))  # a 400 from the API: the error file
    lines.append(_chat_line("streamed", "thanks", stream=True))
    uploaded = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    created = a.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"job": "nightly"},
    )  # fmt: skip
    assert created.status == "validating" and created.object == "batch" and created.metadata == {"job": "nightly"}
    assert created.expires_at == created.created_at + 24 * 3600
    batch = _wait(a, created.id)
    assert batch.status == "completed" and batch.model == MODEL
    assert batch.request_counts.total == 8 and batch.request_counts.completed == 6 and batch.request_counts.failed == 2
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    output = _lines(a, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == [f"r{i}" for i in range(6)]
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"]
        assert response["body"]["object"] == "chat.completion" and response["body"]["service_tier"] == "flex"
        assert response["body"]["choices"][0]["message"]["content"] == "You are welcome."
    errors = {line["custom_id"]: line for line in _lines(a, batch.error_file_id)}
    assert set(errors) == {"bad", "streamed"}
    assert errors["bad"]["response"]["status_code"] == 400
    assert errors["bad"]["response"]["body"]["error"]["param"] == "temperature"
    assert errors["streamed"]["response"]["body"]["error"]["param"] == "body.stream"
    usage = sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in output)
    assert batch.usage.input_tokens == usage and batch.usage.output_tokens > 0
    assert list(live.backend.tiers)[-6:] == ["flex"] * 6
    records = a.get("/usage/records", cast_to=object, options={"params": {"tenant": "tenant-a"}})["data"]
    billed = sorted(r["batch_line"] for r in records if r["batch_line"])  # once per line, however often it ran
    assert billed == sorted(f"{batch.id}/r{i}" for i in range(6)) and {r["service_tier"] for r in records} == {"flex"}
    outputs = [f for f in a.files.list() if f.purpose == "batch_output"]
    assert {f.id for f in outputs} == {batch.output_file_id, batch.error_file_id}
    assert [b.id for b in a.batches.list()] == [batch.id]
    assert list(_client(live, "sk-tenant-b").batches.list()) == []
    with pytest.raises(openai.NotFoundError):
        _client(live, "sk-tenant-b").batches.retrieve(batch.id)


def test_a_responses_batch_answers_as_the_responses_api_would(live):
    a = _client(live)
    lines = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/responses", "body": {"model": MODEL, "input": "thanks"}}
        for i in range(3)
    ]
    uploaded = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = _wait(a, a.batches.create(input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h").id)
    assert batch.status == "completed" and batch.request_counts.completed == 3 and batch.error_file_id is None
    for line in _lines(a, batch.output_file_id):
        body = line["response"]["body"]
        assert body["object"] == "response" and body["status"] == "completed" and body["service_tier"] == "flex"
        assert a.responses.retrieve(body["id"]).output_text == "You are welcome."  # stored as the tenant's


def test_a_file_with_duplicate_ids_or_other_urls_fails_with_the_lines_named(live):
    a = _client(live)
    lines = [_chat_line("same"), _chat_line("same"), {**_chat_line("other"), "url": "/v1/responses"}]
    uploaded = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = _wait(a, a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                       completion_window="24h").id)  # fmt: skip
    assert batch.status == "failed" and batch.failed_at
    assert [(e.code, e.line) for e in batch.errors.data] == [("duplicate_custom_id", 2), ("mismatched_endpoint", 3)]
    assert batch.output_file_id is None and batch.error_file_id is None


def test_a_cancelled_batch_ends_with_what_finished(live):
    a = _client(live)
    lines = [_chat_line(f"p{i}", "pause") for i in range(12)]  # 300 ms a token
    uploaded = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    created = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 30
    while a.batches.retrieve(created.id).status != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelling = a.batches.cancel(created.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = _wait(a, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    assert batch.request_counts.completed < 12
    with pytest.raises(openai.ConflictError):
        a.batches.cancel(created.id)


def test_a_replica_killed_mid_batch_leaves_it_to_another_with_each_line_once(tmp_path, redis_server):
    flush(redis_server)
    script = {"rules": [{"token_delay_ms": 25, "emit": [{"final": "line done"}]}], "service_tiers": True}
    env = {
        "GATEWAY_MOCK_SCRIPT": str(write_script(tmp_path, script)),
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(tmp_path)),
        "GATEWAY_REASONING_KEYS": TEST_KEYS,
        "GATEWAY_REDIS_URL": redis_server.url,
        "GATEWAY_BATCH_POLL_S": "0.2",
        "GATEWAY_BATCH_LEASE_S": "1",
        "GATEWAY_BATCH_LINES_IN_FLIGHT": "2",
    }
    first = GatewayProcess(env, tmp_path / "first.log").start()
    second = None
    try:
        a = _client(first)
        lines = [_chat_line(f"k{i}", f"line {i}") for i in range(30)]
        uploaded = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
        created = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 30
        while (done_there := a.batches.retrieve(created.id).request_counts.completed or 0) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first.process.kill()  # mid-batch: its lease lapses, its lines in flight never finish there
        first.process.wait(10)
        assert done_there < 30, "the batch ended before the kill: the scenario measured nothing"
        second = GatewayProcess(env, tmp_path / "second.log").start()
        batch = _wait(_client(second), created.id)
        output = _lines(_client(second), batch.output_file_id)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert batch.status == "completed" and batch.request_counts.completed == 30 and batch.error_file_id is None
    assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(30))  # each once


def test_a_replica_on_redis_stops_whatever_its_batch_runner_is_doing(tmp_path, redis_server):
    """A runner looking for work in a tight loop of Redis calls is stopped in the middle of one (where Python 3.11's
    wait_for can drop a cancel) and still ends: each of five gateways in turn cleans up well within the bound."""
    flush(redis_server)
    settings = gateway_settings(tmp_path, SCRIPT, redis_url=redis_server.url, batch_poll_s=0.0001)
    for _ in range(5):
        gateway = LiveGateway(settings).start()
        time.sleep(0.05)
        gateway.stop(timeout=10)


def test_concurrent_uploads_never_pass_the_tenant_s_budget(live):
    """Eight uploads of 150,000 bytes at once against a budget of 400,000: two are kept (the check and the charge
    are one step), the others are refused by name, and the files listed are exactly those kept."""
    a = _client(live)
    big = _jsonl([_chat_line("r", "z" * 150_000)])

    def upload(index: int):
        try:
            return a.files.create(file=(f"{index}.jsonl", io.BytesIO(big)), purpose="batch")
        except openai.BadRequestError as exc:
            assert exc.body["code"] == "file_storage_limit_exceeded"
            return None

    with ThreadPoolExecutor(8) as pool:
        kept = [file for file in pool.map(upload, range(8)) if file is not None]
    assert len(kept) == 2 and sum(file.bytes for file in kept) <= 400_000
    assert sorted(f.id for f in a.files.list()) == sorted(file.id for file in kept)


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_a_file_of_several_chunks_reads_back_whole(tmp_path, redis_server, sealed):
    """A 2.6 MB file is kept as three chunks (sealed one by one with encryption at rest) and read back byte for
    byte; its input runs as a batch like any other."""
    flush(redis_server)
    settings = gateway_settings(
        tmp_path, SCRIPT, redis_url=redis_server.url, files_max_bytes=4_000_000, batch_poll_s=0.1,
        store_encryption=sealed,
    )  # fmt: skip
    gateway = LiveGateway(settings).start()
    try:
        a = _client(gateway)
        lines = [_chat_line(f"r{i}", "thanks " + "w" * 500) for i in range(5000)]
        content = _jsonl(lines)
        assert len(content) > 2 * CHUNK_BYTES
        uploaded = a.files.create(file=("big.jsonl", io.BytesIO(content)), purpose="batch")
        assert uploaded.bytes == len(content) and a.files.content(uploaded.id).content == content
    finally:
        gateway.stop()


def test_lines_refused_by_the_tenant_s_rate_limit_are_retried_until_they_run(tmp_path):
    """tenant-a may send 20 requests a minute: a batch of 22 lines spends the burst and meets 429s, which the
    runner retries with backoff until the rate lets each line through; none lands in the error file."""
    settings = gateway_settings(
        tmp_path, SCRIPT, batch_poll_s=0.1, metrics_public=True, metrics_tenants=["tenant-a"],
        limits={"tenants": {"tenant-a": {"requests_per_minute": 20}}},
    )  # fmt: skip
    gateway = LiveGateway(settings).start()
    try:
        a = _client(gateway)
        uploaded = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_chat_line(f"r{i}") for i in range(22)]))),
                                  purpose="batch")  # fmt: skip
        created = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        batch = _wait(a, created.id, timeout_s=90)
        metrics = urllib.request.urlopen(f"{gateway.url}/metrics", timeout=10).read().decode()
    finally:
        gateway.stop()
    assert batch.status == "completed" and batch.request_counts.completed == 22 and batch.error_file_id is None
    refused = [line for line in metrics.splitlines() if line.startswith("gateway_rate_limited_total{")]
    assert any('tenant="tenant-a"' in line and float(line.rsplit(" ", 1)[1]) > 0 for line in refused), refused


def test_a_batch_past_its_window_expires_with_the_lines_not_run_as_batch_expired(tmp_path, monkeypatch):
    """With a completion window of 2.5 s (24 h in production) and lines that take 0.4 s two at a time, the batch
    expires: the lines that finished are in the output file, the others in the error file as `batch_expired`. The
    window runs from `created_at`, a whole second, so it lasts 1.5-2.5 s: room for the first lines on a slow host
    (0.6 s each on CI's), not for all twelve."""
    monkeypatch.setattr(batches_api, "WINDOW_S", 2.5)
    script = {"rules": [{"token_delay_ms": 100, "emit": [{"final": "slow line"}]}], "service_tiers": True}
    settings = gateway_settings(tmp_path, script, batch_poll_s=0.1, batch_lines_in_flight=2)
    gateway = LiveGateway(settings).start()
    try:
        a = _client(gateway)
        lines = [_chat_line(f"e{i}") for i in range(12)]
        uploaded = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
        created = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        batch = _wait(a, created.id)
        done = [line["custom_id"] for line in _lines(a, batch.output_file_id)] if batch.output_file_id else []
        expired = _lines(a, batch.error_file_id)
    finally:
        gateway.stop()
    assert batch.status == "expired" and batch.expired_at
    assert 0 < len(expired) < 12 and {line["error"]["code"] for line in expired} == {"batch_expired"}
    assert sorted(done + [line["custom_id"] for line in expired]) == sorted(f"e{i}" for i in range(12))
