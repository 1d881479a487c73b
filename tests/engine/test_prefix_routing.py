"""Prefix-aware routing over a fleet of the built-in engine's servers: API replicas (`GATEWAY_BACKEND=engine`)
in front of three real `serve-engine` processes, through the `openai` SDK, with no `prompt_cache_key`."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import openai
import pytest
from aiohttp import web
from engine_servers import EngineServer, tiny_engine_options
from gateway_fixtures import KEY_SECRET, write_keys
from live_gateway import GatewayProcess
from threaded_server import ThreadedServer

from backends.base import GenerateRequest, Sampling
from backends.routing.held_pages import PublishedPages, RoutedPages
from backends.routing.kv_events import follow
from backends.routing.router import ServerView
from harmony import load_harmony_encoding

MODEL = "gpt-oss-20b"
KEY = "routing-engine-key"
PAGE = 16
LONG_SYSTEM = "You answer about the fleet. " + " ".join(f"rule{i} applies" for i in range(220))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("routing")
    options = tiny_engine_options(root, max_batch=2, max_positions=4096, page_size=PAGE)
    servers = [EngineServer(options, root / f"engine{i}.log", api_key=KEY).start() for i in range(3)]
    keys = write_keys(root)
    backend = {
        "api_key": KEY,
        "context_length": 4096,
        "probe_interval_s": 0.3,
        "eject_after": 1,
        "load_metrics_interval_s": 0.2,
    }
    env = {
        "GATEWAY_MODELS": MODEL,
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(keys),
        "GATEWAY_BACKEND": "engine",
        "GATEWAY_BACKEND_URLS": ",".join(s.url for s in servers),
        "GATEWAY_BACKEND_OPTIONS": json.dumps(backend),
        "GATEWAY_METRICS_PUBLIC": "1",
    }
    replicas = [GatewayProcess(env, root / f"replica{i}.log").start() for i in range(2)]
    for replica in replicas:  # each has followed every server's events before the tests route
        _wait_for(lambda replica=replica: _metric(replica, "gateway_upstream_page_events_in_sync") == 3)
    yield {"servers": servers, "replicas": replicas, "options": options, "env": env, "root": root}
    for process in (*replicas, *servers):
        process.stop()


def _wait_for(condition, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _metric(replica: GatewayProcess, name: str, **labels: str) -> float:
    """The sum of a replica's samples of `name` whose labels include `labels`."""
    with urllib.request.urlopen(replica.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _chat(replica: GatewayProcess, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=replica.url + "/v1", api_key=key, max_retries=0, timeout=120)


def _served(servers: list[EngineServer]) -> list[float]:
    return [s.metrics()["vllm:prefix_cache_queries_total"] for s in servers]


def _conversation(fleet, index: int, turns: int, key: str = "sk-tenant-a") -> list[tuple[int, int]]:
    """A Chat Completions conversation resending its whole history, each turn through the other replica:
    (prompt tokens, cached tokens) per turn."""
    messages = [
        {"role": "user", "content": f"Conversation {index}: " + " ".join(f"fact{index}x{i}" for i in range(120))}
    ]
    seen = []
    for turn in range(turns):
        replica = fleet["replicas"][turn % 2]
        answer = _chat(replica, key).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0
        )
        usage = answer.usage
        seen.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
        messages += [
            {"role": "assistant", "content": answer.choices[0].message.content or "ok"},
            {
                "role": "user",
                "content": f"Turn {turn} of {index}: " + " ".join(f"more{index}x{turn}x{i}" for i in range(40)),
            },
        ]
    return seen


def test_every_turn_of_a_conversation_reaches_the_server_holding_it_through_either_replica(fleet):
    """No routing key: the Chat Completions resend, alternating between two replicas. Each later turn is served
    from the server that holds the earlier turns: its cache covers all of the earlier prompt."""
    for index in range(4):
        turns = _conversation(fleet, index, 4)
        for (previous, _), (_, cached) in itertools.pairwise(turns):
            assert cached >= previous - 2 * PAGE, turns  # the earlier prompt, less the pages its answer changes
    assert _metric(fleet["replicas"][0], "gateway_routing_decisions_total", how="prefix") > 0
    assert _metric(fleet["replicas"][1], "gateway_routing_decisions_total", how="prefix") > 0


def test_a_keyed_session_resending_its_input_reaches_the_server_holding_it_through_either_replica(fleet):
    """Codex's shape: Responses input resent whole each turn with a `prompt_cache_key`, alternating between the
    replicas: each later turn is served from the server holding the earlier ones (by the pages it holds, in the
    key's namespace), whichever server the key's first request went to."""
    for index in range(3):
        items: list[dict] = []
        turns = []
        for turn in range(4):
            words = 120 if turn == 0 else 40
            items.append({"role": "user", "content": " ".join(f"k{index}t{turn}w{i}" for i in range(words))})
            replica = fleet["replicas"][turn % 2]
            response = _chat(replica).responses.create(
                model=MODEL, input=items, max_output_tokens=16, temperature=0, prompt_cache_key=f"codex-{index}"
            )
            turns.append((response.usage.input_tokens, response.usage.input_tokens_details.cached_tokens))
            items.append({"role": "assistant", "content": response.output_text or "ok"})
        for (previous, _), (_, cached) in itertools.pairwise(turns):
            assert cached >= previous - 2 * PAGE, turns


def test_a_replica_started_later_routes_by_what_the_servers_hold_within_seconds(fleet, tmp_path):
    """A new (or restarted) replica has routed nothing: it takes each server's snapshot and sends a conversation
    that an older replica began to the server that holds it."""
    messages = [{"role": "user", "content": "Begun elsewhere " + " ".join(f"early{i}" for i in range(200))}]
    ask = {"model": MODEL, "max_tokens": 16, "temperature": 0}
    first = _chat(fleet["replicas"][0]).chat.completions.create(messages=messages, **ask)
    started = time.monotonic()
    late = GatewayProcess(fleet["env"], tmp_path / "late.log").start()
    try:
        _wait_for(lambda: _metric(late, "gateway_upstream_page_events_in_sync") == 3, timeout_s=10)
        ready_s = time.monotonic() - started
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
        answer = _chat(late).chat.completions.create(messages=messages, **ask)
    finally:
        late.stop()
    assert answer.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 2 * PAGE
    assert ready_s < 10


def test_a_system_prompt_shared_by_many_sessions_spreads_over_the_servers_under_load(fleet):
    before = _served(fleet["servers"])
    warmed = sum(_metric(replica, "gateway_routing_prefix_warmups_total") for replica in fleet["replicas"])

    def session(index: int) -> int:
        answer = _chat(fleet["replicas"][index % 2]).chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": f"Session {index}"}],
            max_tokens=48,
            temperature=0,
        )
        return answer.usage.prompt_tokens

    with ThreadPoolExecutor(12) as pool:
        prompts = list(pool.map(session, range(12)))
    per_server = [after - earlier for after, earlier in zip(_served(fleet["servers"]), before, strict=True)]
    ahead = sum(_metric(replica, "gateway_routing_prefix_warmups_total") for replica in fleet["replicas"]) - warmed
    assert sum(prompts) <= sum(per_server) <= sum(prompts) + ahead * max(prompts)  # and the prefix sent ahead
    seen = (per_server, _upstream_events(fleet["replicas"]))  # an ejection would explain a server left out
    assert sum(1 for tokens in per_server if tokens) == 3, seen  # the shared prefix did not pin one server
    assert max(per_server) / (sum(per_server) / 3) <= 2.0, seen


def test_a_hot_shared_prompt_is_sent_ahead_to_the_servers_that_do_not_hold_it(fleet):
    """One session on a new long system prompt, then sessions on it two at a time through both replicas, each begun
    once the one before has streamed a third of what the first did (sessions begun at one instant see none of
    each other's load, and a pair ending together stays in step): the server holding the prompt is busier than the
    others, and the replicas send the prompt ahead to them (flex, one token), so they hold it before a session goes
    there: sessions spread over more than one server, each answered from its cache (without the prompt sent ahead
    they stay on the holder, or one pays the prefill elsewhere)."""
    system = "You answer for the warm desk. " + " ".join(f"clause{i} holds" for i in range(220))
    replicas = fleet["replicas"]
    warmed = sum(_metric(replica, "gateway_routing_prefix_warmups_total") for replica in replicas)
    hits = [s.metrics()["vllm:prefix_cache_hits_total"] for s in fleet["servers"]]

    def session(index: int, under_way: threading.Event, mark: int) -> tuple[int, int]:
        """(cached prompt tokens, chunks streamed); `under_way` set once `mark` chunks came, or at the end."""
        stream = _chat(replicas[index % 2]).chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": f"Desk session {index}"}],
            max_tokens=200,  # long enough that a session is still answering when the next is routed
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        cached, chunks = None, 0
        try:
            for chunk in stream:
                chunks += 1
                if chunks >= mark:
                    under_way.set()
                if chunk.usage is not None:
                    cached = chunk.usage.prompt_tokens_details.cached_tokens
        finally:
            under_way.set()
        assert cached is not None
        return cached, chunks

    first, chunks = session(0, threading.Event(), 0)
    assert first < 256  # Harmony's opening alone: the new prompt is held nowhere
    with ThreadPoolExecutor(2) as pool:  # within the servers' slots: the holder is never full, only busier
        running = []
        for index in range(1, 13):  # the next begins once this one runs (a worker free) and is under way
            under_way = threading.Event()
            running.append(pool.submit(session, index, under_way, chunks // 3))
            assert under_way.wait(60)
        cached = [future.result()[0] for future in running]
    ahead = sum(_metric(replica, "gateway_routing_prefix_warmups_total") for replica in replicas) - warmed
    seen = (ahead, cached, _upstream_events(replicas))
    assert 1 <= ahead <= 4, seen  # each other server once a window, from each replica at most
    grown = [s.metrics()["vllm:prefix_cache_hits_total"] - h for s, h in zip(fleet["servers"], hits, strict=True)]
    # sessions spread to a server the prompt was sent ahead to, and none paid its prefill there
    assert sum(tokens >= 512 for tokens in grown) >= 2, (grown, seen)
    assert min(cached) >= 512, seen


def _upstream_events(replicas: list[GatewayProcess]) -> list[str]:
    """What the replicas logged of their model servers (ejections, restorations, lost event streams)."""
    return [line for replica in replicas for line in replica.log_text().splitlines() if '"upstream_' in line]


def test_one_tenant_s_prefix_never_attracts_another_s_request(fleet):
    """Tenant B sends what tenant A sent: B's request is routed by load (nothing of A's counts as held for B),
    and the engine server reuses nothing of A's for B."""
    replica = fleet["replicas"][0]
    text = "Shared secret document. " + " ".join(f"clause{i}" for i in range(300))
    ask = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 16, "temperature": 0}
    _chat(replica, "sk-tenant-a").chat.completions.create(**ask)
    again = _chat(replica, "sk-tenant-a").chat.completions.create(**ask)
    matched_before = _metric(replica, "gateway_routing_prompt_tokens_total", outcome="matched")
    other = _chat(replica, "sk-tenant-b").chat.completions.create(**ask)
    matched_after = _metric(replica, "gateway_routing_prompt_tokens_total", outcome="matched")
    assert again.usage.prompt_tokens_details.cached_tokens >= again.usage.prompt_tokens - PAGE
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert matched_after == matched_before  # B's request matched nothing in the index


def test_a_server_killed_takes_its_prefixes_and_a_restarted_one_is_followed_again(fleet, tmp_path):
    """A conversation's server dies: the next turn goes elsewhere, prefilled again, and does not fail; the
    replicas stop counting its pages; when a server comes back on the same address (a new instance, an empty
    cache), they follow its events again."""
    servers, replica = fleet["servers"], fleet["replicas"][0]
    messages = [{"role": "user", "content": "Pinned conversation " + " ".join(f"pin{i}" for i in range(150))}]
    ask = {"model": MODEL, "max_tokens": 16, "temperature": 0}
    before = _served(servers)
    _chat(replica).chat.completions.create(messages=messages, **ask)
    holder = next(i for i, (a, b) in enumerate(zip(_served(servers), before, strict=True)) if a > b)
    servers[holder].kill()
    answer = _chat(replica).chat.completions.create(messages=messages, **ask)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens_details.cached_tokens < answer.usage.prompt_tokens - 2 * PAGE
    _wait_for(lambda: _metric(replica, "gateway_upstream_page_events_in_sync") == 2)
    # the same address, as a restarted pod keeps its name
    revived = EngineServer(fleet["options"], tmp_path / "revived.log", api_key=KEY, port=servers[holder].port)
    servers[holder] = revived.start()
    _wait_for(lambda: _metric(replica, "gateway_upstream_page_events_in_sync") == 3)
    for _ in range(3):  # taken back by the prober, then used: nothing fails meanwhile
        _chat(replica).chat.completions.create(messages=[{"role": "user", "content": "after the restart"}], **ask)


class LyingEvents:
    """A page-events endpoint whose first stream skips sequence numbers after its snapshot; later streams (a
    restarted server: another instance) are well-formed."""

    def __init__(self) -> None:
        self.streams = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.streams += 1
        instance = f"i{self.streams}"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        snapshot = {"instance": instance, "page_size": 16, "prefix_cache_scope": "tenant", "seq": 5}
        snapshot["pages"] = [["aa" * 16, "bb" * 16]]
        await response.write(f"data: {json.dumps(snapshot)}\n\n".encode())
        await asyncio.sleep(0.3)
        if self.streams == 1:
            gap = {"instance": instance, "first": 9, "seq": 9, "events": [["s", "cc" * 16, "aa" * 16]]}
            await response.write(f"data: {json.dumps(gap)}\n\n".encode())
        await asyncio.sleep(3)
        return response


def test_an_event_stream_with_a_gap_leaves_the_server_out_of_sync_until_a_new_snapshot():
    events = LyingEvents()
    app = web.Application()
    app.router.add_get("/v1/engine/kv_events", events.handle)
    server = ThreadedServer()
    server.serve(lambda: app, handle_signals=False, shutdown_timeout=0.5)
    pages = PublishedPages()
    seen: list[tuple[bool, str | None]] = []

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            task = asyncio.ensure_future(follow(session, server.url, ServerView(RoutedPages(16, 60.0), pages)))
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline and (True, "i2") not in seen:
                await asyncio.sleep(0.01)
                state = (pages.in_sync, pages.instance)
                if state != (False, None) and (not seen or seen[-1] != state):
                    seen.append(state)
                if state == (False, "i1"):
                    assert pages.held([bytes.fromhex("aa" * 16)]) == 0  # out of sync: nothing counts as held
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(run())
    finally:
        server.close()
    assert seen == [(True, "i1"), (False, "i1"), (True, "i2")], seen
    assert pages.held([bytes.fromhex("aa" * 16), bytes.fromhex("cc" * 16)]) == 1


def test_routing_falls_back_to_what_was_routed_while_events_are_out_of_sync(fleet):
    """The engine kind with a server's events out of sync (here: lost before each request) still keeps a
    conversation on its server, by the pages it routed there."""
    from backends.registry import create_backend

    urls = [s.url for s in fleet["servers"] if s.healthy()]
    options = {"urls": urls, "api_key": KEY, "context_length": 4096, "load_metrics_interval_s": 0}
    prompt = [200006, 17360, 200008, *range(4000, 4200)]

    async def run() -> tuple[dict[str, int], list[int]]:
        backend = create_backend("engine", options, load_harmony_encoding())
        try:
            for _ in range(3):
                request = GenerateRequest(prompt, 4, (), "r", sampling=Sampling(temperature=0), tenant="fallback")
                for view in backend.router.servers.values():
                    view.published.lose()
                async for _chunk in backend.generate(request):
                    pass
            return backend.router.stats.routed, [len(view.routed) for view in backend.router.servers.values()]
        finally:
            await backend.aclose()

    routed, remembered = asyncio.run(run())
    assert routed == {"load": 1, "prefix": 2, "key": 0}
    assert sum(1 for pages in remembered if pages) == 1  # all three to the one server
