"""The built-in engine as a model server: API replicas (`GATEWAY_BACKEND=engine`) in front of real
`serve-engine` processes, through the `openai` SDK, against the same engine in-process."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import openai
import pytest
from engine_servers import EngineServer, tiny_engine_options
from live_gateway import GatewayProcess
from otlp_receiver import OtlpReceiver

from backends.base import GenerateRequest, Sampling
from backends.engine_wire import EVENTS_PATH
from backends.page_names import chain, namespace_of
from backends.registry import create_backend
from harmony import load_harmony_encoding

MODEL = "gpt-oss-20b"
ENGINE_KEY = "engine-key-for-tests"
PAGE = 16
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two engine servers, an API replica in front of them and a gateway with the same engine in-process."""
    root = tmp_path_factory.mktemp("engine-server")
    options = tiny_engine_options(root, max_batch=4, max_positions=2048, page_size=PAGE)
    servers = [EngineServer(options, root / f"engine{i}.log", api_key=ENGINE_KEY) for i in range(2)]
    for server in servers:
        server.start()  # one after the other: the first builds the graph the second reads
    remote_options = {"api_key": ENGINE_KEY, "context_length": 2048, "probe_interval_s": 0.5, "eject_after": 1}
    common = {"GATEWAY_MODELS": MODEL, "GATEWAY_AUTH": "off"}
    remote = GatewayProcess(
        {
            **common,
            "GATEWAY_BACKEND": "engine",
            "GATEWAY_BACKEND_URLS": ",".join(s.url for s in servers),
            "GATEWAY_BACKEND_OPTIONS": json.dumps(remote_options),
        },
        root / "remote.log",
    ).start()
    local = GatewayProcess(
        {**common, "GATEWAY_BACKEND": "onnx", "GATEWAY_BACKEND_OPTIONS": json.dumps(options)}, root / "local.log"
    ).start(timeout_s=300)
    yield {"servers": servers, "remote": remote, "local": local, "options": options, "root": root}
    for process in (remote, local, *servers):
        process.stop()


def _client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _comparable(response) -> list:
    """A response's output without its ids: what must be equal token for token."""
    return [{k: v for k, v in item.model_dump().items() if k not in ("id", "call_id")} for item in response.output] + [
        response.status,
        response.usage.output_tokens,
    ]


REQUESTS = [
    {"input": "Say hello", "max_output_tokens": 40},
    {"input": "Weather in Paris?", "max_output_tokens": 120, "tools": [WEATHER], "tool_choice": "required"},
    {
        "input": "How many?",
        "max_output_tokens": 120,
        "text": {"format": {"type": "json_schema", "name": "count", "schema": ANSWER_SCHEMA, "strict": True}},
    },
    {"input": "Penalised and seeded", "max_output_tokens": 30, "temperature": 1, "top_p": 0.9},
]


@pytest.mark.parametrize("request_index", range(len(REQUESTS)))
def test_answers_through_the_wire_equal_the_in_process_engine_s_token_for_token(fleet, request_index):
    asked = {"model": MODEL, "temperature": 0, **REQUESTS[request_index]}
    if asked["temperature"]:  # sampled: the same seed draws the same tokens on both sides
        chat = {"model": MODEL, "messages": [{"role": "user", "content": asked["input"]}], "seed": 5}
        chat |= {"temperature": 1, "top_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": 0.5}
        chat |= {"max_tokens": 30, "logprobs": True, "top_logprobs": 3}
        remote = _client(fleet["remote"]).chat.completions.create(**chat)
        local = _client(fleet["local"]).chat.completions.create(**chat)
        assert remote.choices[0].message.model_dump() == local.choices[0].message.model_dump()
        pairs = zip(remote.choices[0].logprobs.content, local.choices[0].logprobs.content, strict=True)
        for theirs, ours in pairs:
            assert theirs.token == ours.token and abs(theirs.logprob - ours.logprob) < 1e-4
            assert [t.token for t in theirs.top_logprobs] == [t.token for t in ours.top_logprobs]
        return
    remote = _client(fleet["remote"]).responses.create(**asked)
    local = _client(fleet["local"]).responses.create(**asked)
    assert _comparable(remote) == _comparable(local)
    if "tools" in asked:  # the engine held the call to its schema on the far side of the wire too
        call = next(item for item in remote.output if item.type == "function_call")
        assert call.name == "get_weather" and call.arguments.startswith('{"city"')
    if "text" in asked and remote.status == "completed":
        assert set(json.loads(remote.output_text)) == {"answer", "sure"}


def _engine_backend(url: str):
    """The gateway's `engine` backend kind, on the one engine server at `url`."""
    return create_backend(
        "engine", {"urls": [url], "api_key": ENGINE_KEY, "context_length": 2048}, load_harmony_encoding()
    )


async def _generate(
    url: str, prompt: list[int], tenant: str, new_tokens: int = 4, **fields
) -> tuple[list[int], int | None]:
    """Greedy tokens for `prompt` from the engine server at `url`, through the `engine` backend kind, and the
    prompt tokens it reports cached."""
    backend = _engine_backend(url)
    greedy = Sampling(temperature=0)
    request = GenerateRequest(prompt, new_tokens, (), f"req-{tenant}", sampling=greedy, tenant=tenant, **fields)
    tokens, cached = [], None
    try:
        async for chunk in backend.generate(request):
            tokens += chunk.tokens
            cached = chunk.cached_tokens if cached is None else cached
    finally:
        await backend.aclose()
    return tokens, cached


def test_the_prefix_cache_is_the_tenant_s_own_on_the_server_and_cached_tokens_come_back(fleet):
    url = fleet["servers"][0].url
    prompt = [200006, 17360, 200008, *range(1000, 1077)]

    async def scenario() -> list[tuple[list[int], int | None]]:
        return [
            await _generate(url, prompt, "tenant-a"),
            await _generate(url, prompt, "tenant-a"),
            await _generate(url, prompt, "tenant-b"),
            await _generate(url, prompt, "tenant-a", cache_key="session-1"),
        ]

    (first, cached_first), (again, cached_again), (other, cached_other), (keyed, cached_keyed) = asyncio.run(scenario())
    assert first == again == other == keyed  # greedy: the same tokens, cached or not
    assert cached_first == 0 and cached_again == len(prompt) - 1  # all but the last (its logits are needed)
    assert cached_other == 0 and cached_keyed == 0  # another tenant, another cache key: nothing reused


def _read_events(url: str, until, timeout_s: float = 10) -> list[tuple[str, dict]]:
    """The kv_events stream's (event, payload) pairs until `until(pairs)` holds."""

    async def run() -> list[tuple[str, dict]]:
        pairs: list[tuple[str, dict]] = []
        headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
        async with aiohttp.ClientSession() as session, session.get(url + EVENTS_PATH, headers=headers) as response:
            assert response.status == 200
            name = ""
            async with asyncio.timeout(timeout_s):
                async for line in response.content:
                    text = line.decode().strip()
                    if text.startswith("event: "):
                        name = text[7:]
                    elif text.startswith("data: "):
                        pairs.append((name, json.loads(text[6:])))
                        if until(pairs):
                            return pairs
        return pairs

    return asyncio.run(run())


def test_the_pages_a_server_stores_are_published_under_the_names_a_router_computes(fleet):
    server = fleet["servers"][1]
    first = _read_events(server.url, lambda pairs: True)
    ((kind, snapshot),) = first
    assert kind == "snapshot" and snapshot["page_size"] == PAGE and snapshot["prefix_cache_scope"] == "tenant"
    prompt = [200006, 17360, 200008, *range(2000, 2070)]
    asyncio.run(_generate(server.url, prompt, "tenant-events"))
    expected = [name.hex() for name in chain(namespace_of("tenant-events", None, False), prompt, PAGE)]
    listed = _read_events(server.url, lambda pairs: True)[0][1]
    assert listed["instance"] == snapshot["instance"] and listed["seq"] > snapshot["seq"]
    held = {name: parent for name, parent in listed["pages"]}
    assert set(expected) <= set(held)
    assert held[expected[0]] == namespace_of("tenant-events", None, False).hex() and held[expected[1]] == expected[0]

    # live: a new prompt's pages arrive as `pages` events, in order, continuing the snapshot's numbering
    fresh = [200006, 17360, 200008, *range(3000, 3050)]
    fresh_names = {name.hex() for name in chain(namespace_of("tenant-events", None, False), fresh, PAGE)}

    generating: list[threading.Thread] = []

    def stored_all(pairs) -> bool:
        if len(pairs) == 1:  # the snapshot is in: now the prompt
            generating.append(
                threading.Thread(target=asyncio.run, args=(_generate(server.url, fresh, "tenant-events"),))
            )
            generating[0].start()
        stored = {event[1] for _, payload in pairs[1:] for event in payload.get("events", []) if event[0] == "s"}
        return fresh_names <= stored

    pairs = _read_events(server.url, stored_all)
    for thread in generating:  # its answer ends here, not in the next test (which reads the server idle)
        thread.join(timeout=120)
    batches = [payload for kind, payload in pairs[1:] if kind == "pages"]
    assert batches and batches[0]["first"] == pairs[0][1]["seq"] + 1
    assert all(b["first"] == a["seq"] + 1 for a, b in itertools.pairwise(batches))


def test_the_event_stream_says_the_server_s_slots_and_its_load_as_it_changes(fleet):
    """What every replica routes by: the snapshot names the requests the server runs at once and its load (requests
    running and waiting, prompt tokens left to run); a generation's start and end each come as a `load` event
    within moments, not at the next heartbeat. The generation is short, so that the bounds are on the events, not
    on how fast a busy host generates (200 tokens once ran past the 10 s read in the full suite on 2 CPUs)."""
    server = fleet["servers"][1]
    prompt = [200006, 17360, 200008, *range(5000, 5040)]

    def started_and_ended(pairs) -> bool:
        if len(pairs) == 1:
            threading.Thread(target=asyncio.run, args=(_generate(server.url, prompt, "tenant-load", 24),)).start()
        loads = [(payload["running"], payload["waiting"]) for kind, payload in pairs[1:] if kind == "load"]
        return (1, 0) in loads and loads[-1] == (0, 0)

    started = time.monotonic()
    pairs = _read_events(server.url, started_and_ended)
    (kind, snapshot), *rest = pairs
    assert kind == "snapshot" and snapshot["slots"] == fleet["options"]["max_batch"]
    assert (snapshot["running"], snapshot["waiting"]) == (0, 0)
    loads = [payload for kind, payload in rest if kind == "load"]
    assert all(payload["instance"] == snapshot["instance"] for payload in loads)
    assert snapshot["filling"] == 0 and all(0 <= payload["filling"] <= len(prompt) for payload in loads)
    assert loads[-1]["filling"] == 0  # answered: nothing of its prompt left to run
    assert time.monotonic() - started < 4  # the heartbeat's 5 s did not bring them


def test_metrics_say_load_and_kv_use_under_the_inference_gateway_s_names(fleet):
    server = fleet["servers"][0]
    before = server.metrics()
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert name in before
    stream = _client(fleet["remote"]).responses.create(
        model=MODEL, input="stream a while", max_output_tokens=1500, temperature=0, stream=True, prompt_cache_key="m"
    )
    busy = None
    for event in stream:
        if event.type == "response.output_text.delta" or "delta" in event.type:
            busy = [s.metrics() for s in fleet["servers"]]
            break
    stream.close()
    assert busy is not None
    assert sum(m["vllm:num_requests_running"] for m in busy) == 1
    assert max(m["vllm:kv_cache_usage_perc"] for m in busy) > 0


def test_a_client_that_goes_away_frees_its_sequence_on_the_engine_server(fleet):
    servers = fleet["servers"]
    stream = _client(fleet["remote"]).responses.create(
        model=MODEL, input="a long answer", max_output_tokens=1800, temperature=0, stream=True
    )
    for event in stream:
        if "delta" in event.type:
            break
    assert sum(s.metrics()["vllm:num_requests_running"] for s in servers) == 1
    stream.close()
    started = time.monotonic()
    while sum(s.metrics()["vllm:num_requests_running"] for s in servers) and time.monotonic() - started < 5:
        time.sleep(0.02)
    freed_after = time.monotonic() - started
    assert sum(s.metrics()["vllm:num_requests_running"] for s in servers) == 0
    assert freed_after < 2, freed_after


def test_the_engine_server_asks_for_its_key_and_names_what_is_wrong_with_a_request(fleet):
    server = fleet["servers"][0]
    body = json.dumps({"prompt": [1, 2, 3], "max_new_tokens": 2}).encode()

    def post(payload: bytes, key: str | None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        request = urllib.request.Request(server.url + "/v1/engine/generate", payload, headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, {}
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert post(body, None)[0] == 401 and post(body, "wrong")[0] == 401
    status, error = post(json.dumps({"prompt": [], "max_new_tokens": 0}).encode(), ENGINE_KEY)
    assert status == 400 and "prompt" in error["error"]["message"] and "max_new_tokens" in error["error"]["message"]
    status, error = post(json.dumps({"prompt": [1] * 3000, "max_new_tokens": 2}).encode(), ENGINE_KEY)
    assert status == 400 and "exceeds the model's context" in error["error"]["message"]
    status, error = post(json.dumps({"prompt": [1, 2, 3], "max_new_tokens": 2, "continues": [2]}).encode(), ENGINE_KEY)
    assert status == 400 and "continues must be the last tokens of the prompt" in error["error"]["message"]
    assert post(body, ENGINE_KEY)[0] == 200


async def _answer(url: str, request: GenerateRequest) -> list[int]:
    backend = _engine_backend(url)
    try:
        return [token async for chunk in backend.generate(request) for token in chunk.tokens]
    finally:
        await backend.aclose()


def test_an_answer_continued_from_its_first_tokens_ends_as_the_whole_one(fleet):
    """What a server that failed mid-answer leaves to another: the prompt followed by the answer's first tokens
    (`continues`), and the tokens left. With a JSON-schema constraint (its grammar taken past those tokens) and a
    penalty (their counts), greedy, the rest is the whole answer's rest."""
    from backends.base import Constraint

    url = fleet["servers"][1].url
    prompt = [200006, 17360, 200008, *range(3000, 3040), 200007, 200006, 173781]
    asked = GenerateRequest(
        prompt, 40, (200002, 200012), "whole", sampling=Sampling(temperature=0, presence_penalty=1.5),
        constraint=Constraint(final_json_schema=ANSWER_SCHEMA),
    )  # fmt: skip
    whole = asyncio.run(_answer(url, asked))
    begun = whole[:6]
    assert len(whole) > len(begun)
    rest = GenerateRequest(
        prompt + begun, 40 - len(begun), asked.stop_ids, "rest", sampling=asked.sampling,
        constraint=asked.constraint, continues=tuple(begun),
    )  # fmt: skip
    assert asyncio.run(_answer(url, rest)) == whole[len(begun) :]


def test_engine_spans_join_the_request_s_trace(fleet, tmp_path):
    receiver = OtlpReceiver().start()
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    server = EngineServer(fleet["options"], tmp_path / "traced.log", api_key=ENGINE_KEY, **otel).start()
    gateway = GatewayProcess(
        {
            "GATEWAY_MODELS": MODEL,
            "GATEWAY_AUTH": "off",
            "GATEWAY_BACKEND": "engine",
            "GATEWAY_BACKEND_URLS": server.url,
            "GATEWAY_BACKEND_OPTIONS": json.dumps({"api_key": ENGINE_KEY, "context_length": 2048}),
            **otel,
        },
        tmp_path / "gateway.log",
    ).start()
    try:
        _client(gateway).responses.create(model=MODEL, input="traced", max_output_tokens=16)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(s["name"] == "engine.decode" for s in receiver.spans):
            time.sleep(0.05)
    finally:
        gateway.stop()
        server.stop()
        receiver.stop()
    by_id = {s["id"]: s for s in receiver.spans}
    phases = [s for s in receiver.spans if s["name"].startswith("engine.")]
    assert sorted(s["name"] for s in phases) == ["engine.decode", "engine.prefill", "engine.queue"]
    parents = {by_id[s["parent"]]["name"] for s in phases if s["parent"] in by_id}
    assert parents == {f"chat {MODEL}"}  # the gateway's generation span, in the other process
    assert len({s["trace"] for s in receiver.spans}) == 1


def _two_servers_behind_a_gateway(fleet, tmp_path, tag: str) -> tuple[list[EngineServer], GatewayProcess]:
    """Two engine servers of the fleet's options, a test's own (it may kill them), and an API replica before them."""
    servers = [EngineServer(fleet["options"], tmp_path / f"{tag}{i}.log", api_key=ENGINE_KEY).start() for i in range(2)]
    options = {"api_key": ENGINE_KEY, "context_length": 2048, "probe_interval_s": 0.5}
    gateway = GatewayProcess(
        {
            "GATEWAY_MODELS": MODEL,
            "GATEWAY_AUTH": "off",
            "GATEWAY_BACKEND": "engine",
            "GATEWAY_BACKEND_URLS": ",".join(s.url for s in servers),
            "GATEWAY_BACKEND_OPTIONS": json.dumps(options),
        },
        tmp_path / "gateway.log",
    ).start()
    return servers, gateway


def test_a_killed_engine_server_s_requests_go_to_the_other_and_none_fails(fleet, tmp_path):
    servers, gateway = _two_servers_behind_a_gateway(fleet, tmp_path, "k")
    try:
        client = _client(gateway)
        warm = [client.responses.create(model=MODEL, input=f"warm {i}", max_output_tokens=16) for i in range(4)]
        assert all(r.status in ("completed", "incomplete") for r in warm)
        served = [s.metrics()["vllm:prefix_cache_queries_total"] for s in servers]
        busy, spare = (servers[0], servers[1]) if served[0] >= served[1] else (servers[1], servers[0])
        busy.kill()  # the server the conversations' prefixes (the system prompt's pages) lead to
        answers = []
        for i in range(48):  # the router sends a turn to the dead server only where it chooses it (a tie broken by the
            # turn's own hash when no prefix pulls): asked until it has failed there `eject_after` (3) times
            answers.append(client.responses.create(model=MODEL, input=f"after {i}", max_output_tokens=16))
            if len(answers) >= 8 and "upstream_ejected" in gateway.log_text():
                break
        assert all(r.status in ("completed", "incomplete") for r in answers)
        assert spare.metrics()["vllm:prefix_cache_queries_total"] > min(served)
        assert "upstream_ejected" in gateway.log_text(), f"the dead server was never ejected in {len(answers)} turns"
    finally:
        gateway.stop()
        for server in servers:
            server.stop()


def test_a_server_killed_mid_answer_leaves_the_rest_to_the_other_and_the_stream_goes_on(fleet, tmp_path):
    """SIGKILL to the engine server writing a streamed answer, after its first text: the answer continues on the other
    server from the tokens given, and the client's stream ends as the in-process engine's whole answer does."""
    servers, gateway = _two_servers_behind_a_gateway(fleet, tmp_path, "m")
    asked = {"model": MODEL, "input": "Tell me a long story.", "temperature": 0, "max_output_tokens": 600}
    try:
        killed, streamed = None, None
        for event in _client(gateway).responses.create(**asked, stream=True):
            if killed is None and event.type in ("response.reasoning_text.delta", "response.output_text.delta"):
                killed = next(s for s in servers if s.metrics()["vllm:num_requests_running"] == 1)
                killed.kill()
            if event.type in ("response.completed", "response.incomplete", "response.failed"):
                streamed = event.response
        assert killed is not None and streamed is not None and streamed.status != "failed", streamed
        assert "upstream_failed" in gateway.log_text()  # the cut was seen, and the answer went on
    finally:
        gateway.stop()
        for server in servers:
            server.stop()
    whole = _client(fleet["local"]).responses.create(**asked)
    assert _comparable(streamed) == _comparable(whole)


def test_every_field_of_a_generation_request_crosses_the_wire_unchanged():
    """The token protocol carries all the in-process engine is given: sampling, the tenant and cache key, logprobs
    and every kind of output constraint (function schemas, freeform grammars, the hosted tools' headers), and the
    tenant's weight in the engine's fair share and the service tier applied."""
    from backends.base import Constraint
    from backends.engine_wire import WireRequest, request_body

    request = GenerateRequest(
        prompt=[200006, 17360, 200008, 5, 6],
        max_new_tokens=77,
        stop_ids=(200002, 200012),
        request_id="resp_1",
        sampling=Sampling(temperature=0.7, top_p=0.9, seed=11, presence_penalty=0.5, frequency_penalty=-0.25),
        constraint=Constraint(
            tools="required",
            tool_names=("get_weather", "functions.apply_patch"),
            final_json_schema={"type": "object"},
            tool_parameters={"get_weather": WEATHER["parameters"], "other": None},
            tool_grammars={"apply_patch": ("lark", "start: /[a-z]+/"), "note": ("", "")},
            builtin_calls={"python": ("python", None), "browser.search": ("browser.search", {"type": "object"})},
        ),
        cache_key="session-9",
        tenant="acme",
        top_logprobs=3,
        weight=2.5,
        tier="flex",
        continues=(5, 6),
        trace_context={"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"},
    )
    body = json.loads(json.dumps(request_body(request)))  # as it travels
    assert "trace_context" not in body and "traceparent" not in json.dumps(body)  # headers carry it
    assert WireRequest.model_validate(body).generate_request(request.trace_context) == request
