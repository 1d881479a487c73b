"""Remote token servers (vLLM, SGLang, llama.cpp dialects) behind the gateway, through the real openai SDK.

Each test runs in-repo fake servers (tests/support/fake_upstreams.py) that speak the dialect as documented and
record what they were sent and whether the gateway aborted them.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai
import pytest
from fake_upstreams import STOPS, FakeUpstream, fake_logprob
from gateway_fixtures import SCRIPT, WEATHER_TOOL
from live_gateway import GatewayProcess, LiveGateway
from redis_servers import free_port

from backends.base import GenerateRequest
from backends.registry import create_backend
from gateway.config import Settings
from gateway.services import ConfigError, build_services
from harmony import Renderer, load_harmony_encoding

MODEL = "gpt-oss-120b"
DIALECTS = ["vllm", "sglang", "sglang_generate", "sglang_generate_incremental", "llamacpp"]
OVERRUN_SCRIPT = {
    "rules": [
        {"emit": [{"raw": "<|channel|>final<|message|>done<|return|><|start|>assistant<|channel|>final<|message|>"}]},
    ]
}


def _kind(dialect: str) -> str:
    return "sglang_generate" if dialect.startswith("sglang_generate") else dialect


def _fake(dialect: str, script: dict[str, Any] = SCRIPT, **behaviour: Any) -> FakeUpstream:
    incremental = dialect.endswith("_incremental")
    return FakeUpstream(_kind(dialect), script, incremental=incremental, **behaviour)


def _settings(kind: str, urls: list[str], **options: Any) -> Settings:
    backend = {"kind": kind, "options": {"urls": urls, "context_length": 8192, **options}, "models": [MODEL]}
    return Settings(backends={"remote": backend}, keepalive_s=0.2)


@contextmanager
def _serving(kind: str, upstreams: list[FakeUpstream], urls: list[str] | None = None, **options: Any) -> Iterator:
    for upstream in upstreams:
        upstream.start()
    gateway = LiveGateway(_settings(kind, urls or [u.url for u in upstreams], **options)).start()
    try:
        yield gateway, openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test", max_retries=0)
    finally:
        gateway.stop()
        for upstream in upstreams:
            upstream.stop()


def _pool(gateway: LiveGateway):
    return gateway.services.backends[MODEL].pool


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_loop_over_each_dialect(dialect):
    fake = _fake(dialect)
    with _serving(_kind(dialect), [fake]) as (_, client):
        first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL])
        call = next(item for item in first.output if item.type == "function_call")
        assert (first.status, call.name, json.loads(call.arguments)) == ("completed", "get_weather", {"city": "Paris"})
        assert first.usage.input_tokens_details.cached_tokens == fake.cached_tokens
        second = client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}],
            tools=[WEATHER_TOOL],
        )
        assert (second.status, second.output_text) == ("completed", "It is sunny in Paris.")
    encoding = load_harmony_encoding()
    prompt = fake.calls[-1].body.get("input_ids") or fake.calls[-1].body["prompt"]
    assert "sunny, 21 C" in encoding.decode(prompt)
    assert all(call.finished and call.aborted_at is None for call in fake.calls)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_chat_stream_over_each_dialect(dialect):
    fake = _fake(dialect)
    with _serving(_kind(dialect), [fake]) as (_, client):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "thanks!"}],
            stream=True,
            stream_options={"include_usage": True},
            seed=5,
            temperature=0.5,
        )
        chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "You are welcome."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == fake.cached_tokens
    body = fake.calls[0].body
    sampling = body.get("sampling_params", body)
    assert sampling["temperature"] == 0.5
    assert sampling.get("seed", sampling.get("sampling_seed")) == 5


@pytest.mark.parametrize("dialect", DIALECTS)
def test_presence_and_frequency_penalties_reach_each_dialect(dialect):
    fake = _fake(dialect)
    with _serving(_kind(dialect), [fake]) as (_, client):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "thanks!"}],
            presence_penalty=0.5,
            frequency_penalty=-0.25,
        )
        penalties = {"presence_penalty": 1.5, "frequency_penalty": 0.75}  # the SDK's create has no such arguments
        client.responses.create(model=MODEL, input="thanks!", extra_body=penalties)
    sent = [call.body.get("sampling_params", call.body) for call in fake.calls]
    assert [(s["presence_penalty"], s["frequency_penalty"]) for s in sent] == [(0.5, -0.25), (1.5, 0.75)]


@pytest.mark.parametrize("dialect", ["vllm", "llamacpp"])
def test_stop_token_enforced_when_the_server_runs_past_it(dialect):
    fake = _fake(dialect, OVERRUN_SCRIPT, ignore_stops=True, token_delay_s=0.02)
    with _serving(dialect, [fake]) as (_, client):
        response = client.responses.create(model=MODEL, input="hi")
        assert (response.status, response.output_text) == ("completed", "done")
        assert fake.wait_for(lambda: fake.calls[0].aborted_at is not None), "the server was not told to stop"
    assert not fake.calls[0].finished


def test_token_limit_enforced_and_the_upstream_released():
    fake = _fake("vllm")
    with _serving("vllm", [fake]) as (_, client):
        response = client.responses.create(model=MODEL, input="an essay please", max_output_tokens=16)
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert response.usage.output_tokens == 16
    assert fake.calls[0].body["max_tokens"] == 16


@pytest.mark.parametrize("dialect", ["vllm", "sglang_generate", "llamacpp"])
def test_client_disconnect_aborts_the_upstream_within_two_tokens(dialect):
    """The gateway learns of the close when a write fails; on a loaded machine the first write after the
    close can still succeed (the peer's reset is not back yet), so one more token may be generated."""
    fake = _fake(dialect, token_delay_s=0.05)
    with _serving(dialect, [fake]) as (gateway, _):
        connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
        body = {"model": MODEL, "input": "an essay please", "stream": True}
        connection.request("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        while b"reasoning_text.delta" not in response.readline():
            pass
        connection.sock.close()  # the client goes away mid-stream
        connection.close()
        gone_at = time.monotonic()
        assert fake.wait_for(lambda: fake.calls[0].aborted_at is not None), "the upstream request was never aborted"
        call = fake.calls[0]
        after = [t for t in call.sent if t > gone_at]
        assert len(after) <= 2, f"{len(after)} tokens were generated after the client left"
        assert call.aborted_at - gone_at < 3 * fake.token_delay_s + 0.1
        assert not call.finished


def test_cancelling_a_background_response_aborts_the_upstream():
    fake = _fake("sglang", token_delay_s=0.05)
    with _serving("sglang", [fake]) as (_, client):
        started = client.responses.create(model=MODEL, input="an essay please", background=True)
        assert fake.wait_for(lambda: fake.calls and fake.calls[0].sent), "the generation did not start"
        cancelled = client.responses.cancel(started.id)
        assert cancelled.status == "cancelled"
        assert fake.wait_for(lambda: fake.calls[0].aborted_at is not None)
        sent = len(fake.calls[0].sent)
        time.sleep(0.2)
        assert len(fake.calls[0].sent) == sent


def test_failover_to_the_live_upstream_then_probe_back():
    dead_port = free_port()
    live = _fake("vllm")
    revived = _fake("vllm", port=dead_port)
    urls = [f"http://127.0.0.1:{dead_port}", live.url]
    options = {"eject_after": 2, "probe_interval_s": 0.1, "connect_timeout_s": 1, "prefix_routing": False}
    with _serving("vllm", [live], urls=urls, **options) as (gw, client):  # least loaded: the dead one is tried
        for _ in range(6):
            response = client.responses.create(model=MODEL, input="thanks")
            assert response.output_text == "You are welcome."
        dead = _pool(gw).upstreams[0]
        assert not dead.healthy
        revived.start()
        try:
            assert revived.wait_for(lambda: dead.healthy), "the revived upstream was not probed back"
            assert revived.health_checks >= 1
            for _ in range(4):
                client.responses.create(model=MODEL, input="thanks")
            assert revived.calls, "no request went to the upstream after it was taken back"
        finally:
            revived.stop()
    assert len(live.calls) >= 6


def test_a_session_s_turns_reach_one_upstream_by_the_prefix_it_holds():
    """Without a server that says what it holds (vLLM), the router remembers what it sent where: each session's
    later turns go to the upstream that has its earlier ones (Codex's sessions, with or without its
    prompt_cache_key)."""
    upstreams = [_fake("vllm"), _fake("vllm")]
    encoding = load_harmony_encoding()
    with _serving("vllm", upstreams) as (gateway, client):
        for session in range(16):
            key = {"prompt_cache_key": f"s{session}"} if session % 2 else {}
            for _ in range(3):
                client.responses.create(model=MODEL, input=f"thanks {session}", **key)
        report = gateway.services.backends[MODEL].routing_stats()
    where: dict[str, set[int]] = {}
    for index, upstream in enumerate(upstreams):
        for call in upstream.calls:
            session = re.search(r"thanks (\d+)", encoding.decode(call.body["prompt"])).group(1)
            where.setdefault(session, set()).add(index)
    assert len(where) == 16 and all(len(places) == 1 for places in where.values()), where
    assert report.routed["prefix"] >= 32 and report.matched_tokens > 0


def test_vllm_requests_carry_their_tenant_s_cache_salt_and_sglang_s_do_not(monkeypatch):
    """vLLM reuses a prompt's KV only for requests with the same `cache_salt`: each tenant gets its own, the same
    on every replica (an HMAC under the shared secret), unguessable without it."""
    monkeypatch.setenv("GATEWAY_KEY_SECRET", "a-shared-secret-of-the-replicas")
    vllm, sglang = _fake("vllm").start(), _fake("sglang").start()
    encoding = load_harmony_encoding()

    async def run(kind: str, url: str, tenants: list[str]) -> None:
        backend = create_backend(kind, {"urls": [url]}, encoding)
        try:
            for tenant in tenants:
                prompt = encoding.encode_marked("<|start|>user<|message|>thanks<|end|>")
                request = GenerateRequest(prompt, 8, tuple(STOPS), "r")
                request.tenant = tenant
                async for _ in backend.generate(request):
                    pass
        finally:
            await backend.aclose()

    try:
        asyncio.run(run("vllm", vllm.url, ["acme", "acme", "globex"]))
        again = create_backend("vllm", {"urls": [vllm.url]}, encoding).dialect.salt("acme")  # another replica's
        asyncio.run(run("sglang", sglang.url, ["acme"]))
    finally:
        vllm.stop()
        sglang.stop()
    salts = [call.body["cache_salt"] for call in vllm.calls]
    assert salts[0] == salts[1] == again != salts[2] and len(salts[0]) == 43
    assert "acme" not in salts[0] and "cache_salt" not in sglang.calls[0].body


def test_5xx_before_the_first_token_moves_to_another_upstream():
    failing = _fake("vllm", status=503)
    healthy = _fake("vllm")
    with _serving("vllm", [failing, healthy], prefix_routing=False) as (_, client):
        for _ in range(3):
            assert client.responses.create(model=MODEL, input="thanks").status == "completed"
    assert len(failing.calls) >= 1 and len(healthy.calls) == 3


def test_silence_before_the_first_token_moves_to_another_upstream():
    stalled = _fake("llamacpp", stall_after=0)
    healthy = _fake("llamacpp")
    with _serving("llamacpp", [stalled, healthy], first_token_timeout_s=0.3, prefix_routing=False) as (_, client):
        for _ in range(2):
            assert client.responses.create(model=MODEL, input="thanks").output_text == "You are welcome."
    assert stalled.calls and all(call.aborted_at is not None for call in stalled.calls)


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "llamacpp"])
def test_silence_after_tokens_continues_the_answer_on_another_upstream(dialect):
    """The stalled server's 5 tokens stay; the other server is sent the prompt followed by them, with 5 tokens less
    to write, and the client gets the answer one server gives (streamed: every token once)."""
    whole = _fake(dialect)
    with _serving(_kind(dialect), [whole]) as (_, client):
        expected = client.responses.create(model=MODEL, input="thanks", max_output_tokens=200)
    stalled = _fake(dialect, stall_after=5)
    other = _fake(dialect)
    with _serving(_kind(dialect), [stalled, other], token_timeout_s=0.3) as (gateway, client):
        _pool(gateway).upstreams[1].outstanding = 1  # the stalling server is chosen first
        with client.responses.stream(model=MODEL, input="thanks", max_output_tokens=200) as stream:
            deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
            response = stream.get_final_response()
        assert stalled.wait_for(lambda: stalled.calls[0].aborted_at is not None)
        _pool(gateway).upstreams[1].outstanding = 0
    assert (response.status, response.output_text) == ("completed", expected.output_text)
    assert "".join(deltas) == expected.output_text
    first, second = stalled.calls[0].body, other.calls[0].body
    sent = whole.calls[0].body
    key = "prompt"
    assert second[key][: len(first[key])] == first[key] and len(second[key]) == len(first[key]) + 5
    limit = "n_predict" if dialect == "llamacpp" else "max_tokens"
    assert second[limit] == sent[limit] - 5


def test_an_upstream_400_fails_with_its_message_and_is_not_retried():
    rejecting = _fake("vllm", status=400)
    other = _fake("vllm")
    with _serving("vllm", [rejecting, other]) as (gateway, client):
        _pool(gateway).upstreams[1].outstanding = 1  # the rejecting server is chosen first
        response = client.responses.create(model=MODEL, input="thanks")
        with pytest.raises(openai.APIStatusError) as failure:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "thanks"}])
        _pool(gateway).upstreams[1].outstanding = 0
    assert response.status == "failed"
    assert "HTTP 400" in response.error.message and "maximum context length" in response.error.message
    assert failure.value.status_code == 502 and "maximum context length" in failure.value.message
    assert other.calls == []


def test_an_error_event_mid_stream_fails_the_response():
    fake = _fake("sglang_generate", error_after=3)
    with _serving("sglang_generate", [fake]) as (_, client):
        events = list(client.responses.create(model=MODEL, input="thanks", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.message == "The model server reported an error: CUDA out of memory (fake)"


def _readiness(gateway: LiveGateway) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(gateway.url + "/readyz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_all_upstreams_unreachable_fails_cleanly_and_the_replica_is_not_ready():
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with _serving("llamacpp", [], urls=urls, eject_after=1, probe_interval_s=60) as (gateway, client):
        assert _readiness(gateway)[0] == 200
        response = client.responses.create(model=MODEL, input="thanks")
        status, body = _readiness(gateway)
    assert (response.status, response.error.message) == ("failed", "The model server could not be reached.")
    assert (status, body["status"], body["models"], body["store"]) == (503, "unavailable", {MODEL: "unavailable"}, "ok")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"urls": ["ftp://host"]}, "options.urls"),
        ({"urls": []}, "options.urls"),
        ({"urls": ["http://a:1"], "timeout": 3}, "options.timeout"),
        ({"urls": ["http://a:1"], "token_timeout_s": 0}, "options.token_timeout_s"),
        ({}, "options.urls"),
    ],
)
def test_bad_remote_options_are_configuration_errors(options, named):
    settings = Settings(backends={"edge": {"kind": "vllm", "options": options, "models": [MODEL]}})
    with pytest.raises(ConfigError) as error:
        build_services(settings, Renderer(load_harmony_encoding()))
    assert str(error.value).startswith("backends.edge: vllm backend:") and named in str(error.value)


def test_serve_in_front_of_a_vllm_server_from_the_environment(tmp_path):
    fake = _fake("vllm").start()
    env = {
        "GATEWAY_BACKEND": "vllm",
        "GATEWAY_BACKEND_URLS": fake.url,
        "GATEWAY_BACKEND_OPTIONS": '{"model": "openai/gpt-oss-120b", "context_length": 4096}',
        "GATEWAY_MODELS": MODEL,
    }
    process = GatewayProcess(env, tmp_path / "gateway.log").start()
    try:
        client = openai.OpenAI(base_url=process.url + "/v1", api_key="sk-test", max_retries=0)
        assert client.models.retrieve(MODEL).id == MODEL
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "thanks"}])
        assert reply.choices[0].message.content == "You are welcome."
    finally:
        process.stop()
        fake.stop()
    assert fake.calls[0].body["model"] == "openai/gpt-oss-120b"
    assert "You are welcome" not in process.log_text()


def _scored_text(entries) -> str:
    return "".join(entry.token for entry in entries)


def test_vllm_logprobs_map_onto_the_final_answer_in_both_apis():
    """vLLM's per-token logprobs (asked with token ids) become the answer's: on the Responses output_text part and
    its deltas, on Chat's choice and its chunks; the reasoning's tokens have none; alternatives as asked."""
    fake = _fake("vllm")
    wanted = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    with _serving("vllm", [fake]) as (_, client):
        response = client.responses.create(model=MODEL, input="thanks!", **wanted)
        events = list(client.responses.create(model=MODEL, input="thanks!", stream=True, **wanted))
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "thanks!"}], logprobs=True, top_logprobs=1
        )
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "thanks!"}], logprobs=True, stream=True
            )
        )
    (message,) = [item for item in response.output if item.type == "message"]
    entries = message.content[0].logprobs
    assert _scored_text(entries) == response.output_text == "You are welcome."
    assert any(item.type == "reasoning" for item in response.output)  # its tokens were scored too, and left out
    for entry in entries:
        assert entry.top_logprobs[0].token == entry.token and bytes(entry.bytes).decode() == entry.token
        assert [alt.logprob for alt in entry.top_logprobs] == [entry.logprob, entry.logprob - 1]
        assert entry.logprob in {fake_logprob(n) for n in range(7)}
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert [e.token for d in deltas for e in d.logprobs] == [e.token for e in entries]
    done = [event for event in events if event.type == "response.output_text.done"]
    assert [e.logprob for e in done[0].logprobs] == [e.logprob for e in entries]
    assert _scored_text(chat.choices[0].logprobs.content) == chat.choices[0].message.content == "You are welcome."
    assert all(len(entry.top_logprobs) == 1 for entry in chat.choices[0].logprobs.content)
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert _scored_text(streamed) == "You are welcome." and all(not e.top_logprobs for e in streamed)
    asked = [(call.body["logprobs"], call.body["return_tokens_as_token_ids"]) for call in fake.calls]
    assert asked == [(2, True), (2, True), (1, True), (0, True)]


LONG_HEADER_WORDS = " ".join(f"w{n}" for n in range(90))
MALFORMED_SCRIPT = {
    "rules": [
        {"match": {"user": "long"}, "emit": [{"raw": f"<|channel|>final {LONG_HEADER_WORDS}<|return|>"}]},
        {"emit": [{"raw": "The answer, with no header at all.<|return|>"}]},
    ]
}


@pytest.mark.parametrize("prompt", ["a long header", "no header"])
def test_logprobs_never_change_or_lose_an_answer_read_from_a_malformed_header(prompt):
    """A header past the parser's limit, and one with no channel and no <|message|>: the answer is the same
    with and without logprobs, cut by max_output_tokens or not, and its logprob tokens make up its text."""
    fake = _fake("vllm", MALFORMED_SCRIPT)
    wanted = {"include": ["message.output_text.logprobs"], "top_logprobs": 1}
    texts = []
    with _serving("vllm", [fake]) as (_, client):
        for limit in ({}, {"max_output_tokens": 80}):
            plain = client.responses.create(model=MODEL, input=prompt, **limit)
            texts.append(plain.output_text)
            scored = client.responses.create(model=MODEL, input=prompt, **limit, **wanted)
            assert scored.output_text == plain.output_text and plain.output_text
            assert [item.status for item in scored.output] == [item.status for item in plain.output]
            assert _scored_text(scored.output[-1].content[0].logprobs) == scored.output_text
            chat = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], logprobs=True, max_tokens=80
            )
            assert _scored_text(chat.choices[0].logprobs.content) == chat.choices[0].message.content
    if prompt == "a long header":
        assert texts[0] == LONG_HEADER_WORDS and texts[1].startswith("w0 w1") and len(texts[1]) < len(texts[0])


def test_a_vllm_that_names_logprob_tokens_by_text_fails_the_response_with_the_reason():
    fake = _fake("vllm", logprobs_by_text=True)
    with _serving("vllm", [fake]) as (_, client):
        response = client.responses.create(
            model=MODEL, input="thanks!", include=["message.output_text.logprobs"], top_logprobs=1
        )
    assert response.status == "failed" and "return_tokens_as_token_ids" in response.error.message


@pytest.mark.parametrize("dialect", ["sglang_generate", "llamacpp"])
def test_a_backend_without_logprobs_refuses_them_with_a_400(dialect):
    fake = _fake(dialect)
    with _serving(_kind(dialect), [fake]) as (_, client):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "thanks!"}], logprobs=True, top_logprobs=2
            )
        with pytest.raises(openai.BadRequestError) as without_logprobs:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "thanks!"}], top_logprobs=2
            )
    assert refused.value.body["param"] == "logprobs" and "does not return logprobs" in refused.value.body["message"]
    assert without_logprobs.value.body["param"] == "top_logprobs"
    assert fake.calls == []


def test_replicas_share_what_they_sent_where_through_redis(redis_server, monkeypatch):
    """Servers that publish nothing (here vLLM without its events): a replica routes a conversation by what another
    replica sent where, read from Redis, not only by its own record. The first replica could not use the server
    the prompt hashes to (ejected there), so without the shared record the second would send the next turn to
    that server instead of the one holding the conversation."""
    from gateway.services import QuietRouteBook
    from state.route_book import RedisRouteBook

    monkeypatch.setenv("GATEWAY_KEY_SECRET", "a-shared-secret-of-the-replicas")
    upstreams = [_fake("vllm").start() for _ in range(3)]
    encoding = load_harmony_encoding()
    options = {"urls": [u.url for u in upstreams], "load_metrics_interval_s": 0}
    prompt = [*encoding.encode_marked("<|start|>user<|message|>"), *range(3000, 3200)]

    def request(tokens: list[int]) -> GenerateRequest:
        return GenerateRequest(tokens, 8, tuple(STOPS), "r", tenant="acme")

    async def scenario() -> tuple[str, str, str]:
        book = RedisRouteBook.from_url(redis_server.url)
        dry, first, second = (create_backend("vllm", options, encoding) for _ in range(3))
        try:
            anchor = dry.router.choose(request(prompt), {u.url: 0 for u in dry.pool.upstreams}).url
            for replica in (first, second):
                replica.share_routes(QuietRouteBook(book))
            next(u for u in first.pool.upstreams if u.url == anchor).ejected_at = time.monotonic()
            async for _ in first.generate(request(prompt)):
                pass
            await first.shared.settled()  # the shared record is written in the background
            async for _ in second.generate(request([*prompt, 11, 12, 13])):
                pass
            return anchor, second.routing_stats().routed["prefix"], second.routing_stats().matched_tokens
        finally:
            for backend in (dry, first, second):
                await backend.aclose()
            await book.aclose()

    try:
        anchor, by_prefix, matched = asyncio.run(scenario())
    finally:
        for upstream in upstreams:
            upstream.stop()
    served = [len(upstream.calls) for upstream in upstreams]
    holder = served.index(2)  # both turns on one server
    assert upstreams[holder].url != anchor and sum(served) == 2
    assert by_prefix == 1 and matched >= 192


def test_a_conversation_keeps_to_its_server_when_its_shared_first_pages_were_last_sent_elsewhere():
    """A tenant's sessions share their first pages (a system prompt), last sent to whichever server took the
    latest session; a page's name stands for its whole prefix, so the server sent this conversation's deeper
    pages holds all of it and gets the next turn."""
    upstreams = [_fake("vllm").start() for _ in range(3)]
    encoding = load_harmony_encoding()
    prompt = [*encoding.encode_marked("<|start|>system<|message|>"), *range(4000, 4300)]

    class Book:
        def __init__(self) -> None:
            self.servers: dict[bytes, str] = {}

        async def lookup(self, scope: str, names: list[bytes]) -> list[str | None]:
            return [self.servers.get(name) for name in names]

        async def note(self, scope: str, names: list[bytes], server: str, ttl_s: float) -> None:
            self.servers.update(dict.fromkeys(names, server))

    chosen: list[str] = []

    async def scenario() -> None:
        options = {"urls": [u.url for u in upstreams], "load_metrics_interval_s": 0}
        backend, dry = create_backend("vllm", options, encoding), create_backend("vllm", options, encoding)
        book = Book()
        backend.share_routes(book)
        request = GenerateRequest(prompt, 8, tuple(STOPS), "r", tenant="acme")
        names = backend.router.shared_names(backend.router.pages(request).routed())
        anchor = dry.router.choose(request, {u.url: 0 for u in dry.pool.upstreams}).url  # where a miss would go
        holder, other = [u.url for u in upstreams if u.url != anchor]
        book.servers.update(dict.fromkeys(names, holder))  # this conversation: on one server
        book.servers.update(dict.fromkeys(names[:3], other))  # its first pages: last sent to another
        chosen.append(holder)
        try:
            async for _ in backend.generate(request):
                pass
        finally:
            await backend.aclose()
            await dry.aclose()

    try:
        asyncio.run(scenario())
    finally:
        for upstream in upstreams:
            upstream.stop()
    assert [len(upstream.calls) for upstream in upstreams] == [int(u.url == chosen[0]) for u in upstreams]


def test_a_shared_record_whose_redis_is_down_leaves_routing_to_each_replica():
    """The record's Redis unreachable: lookups know nothing, writes are lost, generations go on."""
    from gateway.services import QuietRouteBook
    from state.route_book import RedisRouteBook

    upstream = _fake("vllm").start()
    encoding = load_harmony_encoding()

    async def scenario() -> tuple[list, int]:
        book = QuietRouteBook(RedisRouteBook.from_url(f"redis://127.0.0.1:{free_port()}/0"))
        backend = create_backend("vllm", {"urls": [upstream.url], "load_metrics_interval_s": 0}, encoding)
        backend.share_routes(book)
        try:
            prompt = [*encoding.encode_marked("<|start|>user<|message|>"), *range(100, 200)]
            async for _ in backend.generate(GenerateRequest(prompt, 8, tuple(STOPS), "r", tenant="acme")):
                pass
            await backend.shared.settled()
            return await book.lookup("scope", [b"x" * 16]), len(upstream.calls)
        finally:
            await backend.aclose()
            await book.book.aclose()

    try:
        assert asyncio.run(scenario()) == ([None], 1)
    finally:
        upstream.stop()


def test_vllm_with_priority_scheduling_gets_each_request_s_tier_as_its_priority():
    """`priority_scheduling: true`: vLLM's `priority` carries the tier (lower runs first) and the backend says it
    schedules by tier; without it nothing is sent and every tier is applied as default; SGLang refuses it."""
    vllm = _fake("vllm").start()
    encoding = load_harmony_encoding()

    async def run(options: dict) -> bool:
        backend = create_backend("vllm", {"urls": [vllm.url], **options}, encoding)
        try:
            for tier in ("priority", "default", "flex"):
                prompt = encoding.encode_marked("<|start|>user<|message|>thanks<|end|>")
                async for _ in backend.generate(GenerateRequest(prompt, 8, tuple(STOPS), "r", tier=tier)):
                    pass
            return backend.capabilities.service_tiers
        finally:
            await backend.aclose()

    try:
        assert asyncio.run(run({"priority_scheduling": True})) is True
        assert asyncio.run(run({})) is False
    finally:
        vllm.stop()
    assert [call.body.get("priority") for call in vllm.calls] == [-1, 0, 1, None, None, None]
    with pytest.raises(ValueError, match="priority_scheduling"):
        create_backend("sglang", {"urls": [vllm.url], "priority_scheduling": True}, encoding)
