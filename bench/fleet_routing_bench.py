"""Routing by prefix over a fleet of model servers, against least-loaded routing, in one run.

    python bench/fleet_routing_bench.py [--layers 1] [--llama-cpp TREE --convert-python PY] [--vllm-stand-in]
        [--skip-engine] [--write docs/benchmarks.md]

Three engine servers (`serve-engine`: a random checkpoint of gpt-oss-20b's width, hidden 2880, vocabulary 201,088,
and few layers, on the CPU) and two gateway replicas (`GATEWAY_BACKEND=engine`, one Redis) behind a round-robin
HAProxy, so that a conversation's turns alternate between the replicas; each server confined to `--server-cpus`
of a CPU's time (half by default; cpu_quota.py: three servers on two cores would otherwise lend an idle one's time
to the others). Each workload runs three times on fresh servers: with prefix routing (the default), with
least-loaded routing (`prefix_routing: false`, the servers' `prompt_cache_key` affinity kept), and on one server
alone, which holds everything (the reference for what can be served from cache). Workloads, each with its own
prompts, conversations run side by side:

- `previous_response_id`: Responses conversations continued by id (tool-free turns);
- Chat Completions resend: the whole history sent again each turn;
- shared system prompt: a tenant's users, each one request, sharing one long system prompt (the first user alone,
  then six at a time: more than one server's batch);
- Codex-like: Responses conversations with `prompt_cache_key`, every turn resending the input.

Conversations are shaped as an agent's session: a long opening (~1,400 tokens: its instructions and task) and
short turns after it (~100 tokens with the answer before them), six turns, six conversations at a time.

Per workload: prompt tokens served from cache as a fraction of the one-server reference, time to first token
(the first token a JSON-schema answer streams, reasoning or answer text, as the client sees it)
p50 and p90, and the busiest server's requests in flight (averaged over the run from when its requests come at
once) and prompt tokens, each over the servers' mean. Then the previous_response_id workload again with one server
killed halfway: requests failed, and the cache fraction.

`--llama-cpp` runs the first two workloads again over three `llama-server`s (routing by what was sent where), and
`--vllm-stand-in` over three stand-ins for vLLM's server that publish its KV-cache events (vllm_stand_in.py; routing
by those events), each in a section of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from cpu_quota import CpuQuota  # noqa: E402
from engine_servers import EngineServer  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from redis_servers import RedisServer, free_port  # noqa: E402
from report import cpu_line, markers, write_section  # noqa: E402
from server_process import ServerProcess  # noqa: E402
from vllm_stand_in import PREFILL_S_PER_TOKEN, TOKEN_DELAY_S, VllmStandIn  # noqa: E402

from backends.engine.config import GPT_OSS_20B  # noqa: E402
from backends.engine.kernels.build import KERNELS_ENV, build_library  # noqa: E402
from backends.engine.make_checkpoint import write_random_checkpoint  # noqa: E402

NAME = "fleet_routing_bench"
LLAMA_NAME = "fleet_routing_bench_llama_cpp"  # its own section: a run without --llama-cpp leaves it as it was
VLLM_NAME = "fleet_routing_bench_vllm_stand_in"  # likewise, --vllm-stand-in's
MODEL = "gpt-oss-20b"
KEY = "bench-fleet-key"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
FORMAT = {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}}
CONVERSATIONS, TURNS = 6, 6  # 6 on 3 servers: one conversation a server can balance them
# An agent's session: a long opening (its instructions, tools and task) and short turns after it; a word is ~7
# tokens, so the opening is ~1,400 tokens and each later turn ~100 (with the answer before it)
FIRST_WORDS, LATER_WORDS = 200, 15
USERS, USERS_AT_ONCE = 24, 6  # a shared system prompt's users: the first alone, then more at once than a batch
# One intra-op thread a server: three servers share this machine's CPUs, and a server running two would wait, at
# every operator, for its other thread while another server's ran (a fleet's servers each have their own machine)
SERVER_THREADS = 1
# Each server's share of the CPUs (bench/cpu_quota.py): three shared two cores, and while one idled the others ran
# faster, so routing that left a server idle looked better than on a fleet whose servers have a machine each (in a
# run unconfined, Codex-like sessions' first token p50 was 0.72x of least loaded's, whose keys left a server at 0.57
# requests in flight on average against 2.75 on another); three halves leave half a core to the replicas and clients
SERVER_CPUS = 0.5
KV_CACHE_TOKENS = 65_536  # each server's pool: one server holds every conversation of a workload (the reference)
# An agent's pause between turns (its tool running, its user reading), drawn per conversation and turn from a seeded
# generator; the conversations start as far apart. Without it the conversations moved in lock step, and
# least-loaded routing's round robin sent each one back to the same server every turn (a fleet's traffic does not
# keep such step: 0.87 of the cache in an earlier run of this script without pauses)
PAUSE_S = 1.5
LOAD_EVERY_S = 0.25  # how often each server's requests in flight are read from its /metrics


@dataclass
class Sample:
    prompt: int
    cached: int
    ok: bool = True
    first_token_s: float | None = None  # from sending the request to its first token (reasoning or answer text),
    # also where a request failed after it
    turn: int = 0  # its place in its conversation (0: the opening, or a request of its own)


@dataclass
class Result:
    samples: list[Sample] = field(default_factory=list)
    per_server: list[float] = field(default_factory=list)  # prompt tokens each server was given
    load: list[float] = field(default_factory=list)  # each server's requests in flight (running + waiting), averaged
    # set when the workload's requests begin to come at once: the load is averaged from then (a shared system
    # prompt's first user, alone, is one request on one server under any routing)
    loaded: threading.Event = field(default_factory=threading.Event)
    # at the end, as the replicas' /metrics say: servers whose page events they follow, and the pages published
    in_sync: tuple[int, int] = (0, 0)  # (followed in step, of)
    published_pages: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sample: Sample) -> None:
        with self.lock:
            self.samples.append(sample)

    @property
    def cached(self) -> int:
        return sum(s.cached for s in self.samples if s.ok)

    def first_token(self, q: float, later: bool = False) -> float:
        """The q-quantile (nearest rank) of the clients' times to the first token (`later`: of the turns after the
        conversations' openings only)."""
        samples = [s for s in self.samples if s.ok and s.first_token_s is not None and (s.turn > 0 or not later)]
        times = sorted(s.first_token_s for s in samples)
        return times[min(len(times) - 1, round(q * (len(times) - 1)))] if times else float("nan")

    @property
    def failed(self) -> int:
        return sum(not s.ok for s in self.samples)

    @property
    def failed_streaming(self) -> int:
        """Failed after their first token had streamed (a server killed mid-answer)."""
        return sum(not s.ok and s.first_token_s is not None for s in self.samples)

    @property
    def imbalance(self) -> float:
        """The busiest server's prompt tokens over the servers' mean."""
        return _over_mean(self.per_server)

    @property
    def load_imbalance(self) -> float:
        """The busiest server's requests in flight, averaged from when requests come at once, over the servers'
        mean."""
        return _over_mean(self.load)


def _over_mean(values: list[float]) -> float:
    mean = statistics.mean(values) if values else 0
    return max(values) / mean if mean else float("nan")


def pause(rng: random.Random) -> None:
    time.sleep(rng.uniform(0, PAUSE_S))


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}w{i}" for i in range(count))


def stream_response(client: openai.OpenAI, **asked) -> tuple[Sample, str | None]:
    final, first = None, None
    started = time.perf_counter()
    try:
        asked = {"model": MODEL, "stream": True, "max_output_tokens": 24, "temperature": 0, "text": FORMAT, **asked}
        with client.responses.create(**asked) as stream:
            for event in stream:
                if first is None and event.type in ("response.output_text.delta", "response.reasoning_text.delta"):
                    first = time.perf_counter() - started
                if event.type in ("response.completed", "response.incomplete"):
                    final = event.response
    except openai.APIError:
        return Sample(0, 0, ok=False, first_token_s=first), None
    if final is None:  # the stream ended without a completed or incomplete response (a failed one)
        return Sample(0, 0, ok=False, first_token_s=first), None
    usage = final.usage
    return Sample(usage.input_tokens, usage.input_tokens_details.cached_tokens, first_token_s=first), final.id


def chained(url: str, result: Result, tag: str, halfway: threading.Event | None = None) -> None:
    """previous_response_id conversations."""

    def conversation(index: int) -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-bench", max_retries=0, timeout=600)
        previous, rng = None, random.Random(index)  # the same pauses under every routing
        for turn in range(TURNS):
            pause(rng)
            text = words(f"{tag}c{index}t{turn}", FIRST_WORDS if turn == 0 else LATER_WORDS)
            asked = {"input": text, **({"previous_response_id": previous} if previous else {})}
            sample, previous = stream_response(client, **asked)
            sample.turn = turn
            result.add(sample)
            if halfway is not None and index == 0 and turn == TURNS // 2 - 1:
                halfway.set()
            if previous is None:
                return

    result.loaded.set()
    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        list(pool.map(conversation, range(CONVERSATIONS)))


def resent(url: str, result: Result, tag: str, key: bool = False) -> None:
    """Conversations that send their whole history each turn: Chat Completions, or (Codex-like) Responses input
    items with `prompt_cache_key`."""

    def conversation(index: int) -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-bench", max_retries=0, timeout=600)
        history: list[dict] = []
        rng = random.Random(index)  # the same pauses under every routing
        for turn in range(TURNS):
            pause(rng)
            text = words(f"{tag}c{index}t{turn}", FIRST_WORDS if turn == 0 else LATER_WORDS)
            history.append({"role": "user", "content": text})
            if key:
                sample, _ = stream_response(client, input=history, prompt_cache_key=f"{tag}-session-{index}")
                answer = "noted"
            else:
                sample, answer = stream_chat(client, history)
            sample.turn = turn
            result.add(sample)
            if not sample.ok:
                return
            history.append({"role": "assistant", "content": answer})

    result.loaded.set()
    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        list(pool.map(conversation, range(CONVERSATIONS)))


def stream_chat(client: openai.OpenAI, messages: list[dict]) -> tuple[Sample, str]:
    usage, text, first = None, [], None
    started = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}},
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            text += [choice.delta.content or "" for choice in chunk.choices]
            reasoning = any((choice.delta.model_extra or {}).get("reasoning") for choice in chunk.choices)
            if first is None and (any(text) or reasoning):
                first = time.perf_counter() - started
    except openai.APIError:
        return Sample(0, 0, ok=False, first_token_s=first), ""
    if usage is None:
        return Sample(0, 0, ok=False, first_token_s=first), ""
    sample = Sample(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, first_token_s=first)
    return sample, "".join(text) or "ok"


def shared_system(url: str, result: Result, tag: str) -> None:
    system = f"You are the {tag} assistant. " + words(f"{tag}sys", 600)

    def user(index: int) -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-bench", max_retries=0, timeout=600)
        question = f"User {index} asks " + words(f"{tag}u{index}", 30)
        sample, _ = stream_response(client, instructions=system, input=question)
        result.add(sample)

    user(0)  # the prompt in use before the others come
    result.loaded.set()
    with ThreadPoolExecutor(USERS_AT_ONCE) as pool:
        list(pool.map(user, range(1, USERS)))


WORKLOADS = {
    "previous_response_id": chained,
    "Chat Completions resend": resent,
    "shared system prompt": shared_system,
    "Codex-like (prompt_cache_key)": lambda url, result, tag: resent(url, result, tag, key=True),
}


class Engines:
    """The built-in engine's servers: routing by the pages they publish."""

    kind = "engine"

    def __init__(self, options: dict) -> None:
        self.options = options

    def make(self, work: Path, index: int) -> EngineServer:
        return EngineServer(self.options, work / f"e{index}.log", api_key=KEY)

    def backend_options(self, servers: list[EngineServer]) -> dict:
        return {"api_key": KEY, "context_length": 4096}

    @staticmethod
    def prompt_tokens(server: EngineServer) -> float:
        return server.metrics()["vllm:prefix_cache_queries_total"]

    @staticmethod
    def load(server: EngineServer) -> float:
        metrics = server.metrics()
        return metrics["vllm:num_requests_running"] + metrics["vllm:num_requests_waiting"]


class LlamaServer(ServerProcess):
    """`llama-server` on a GGUF, with its metrics."""

    def __init__(self, binary: Path, gguf: Path, log_path: Path) -> None:
        super().__init__([], log_path)
        self.args = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port), "-c", "8192",
                     "-np", "2", "-t", "1", "--metrics", "--no-webui"]  # fmt: skip


class LlamaServers:
    """llama.cpp's servers: routing by what was sent where (they publish nothing)."""

    kind = "llamacpp"

    def __init__(self, binary: Path, gguf: Path) -> None:
        self.binary, self.gguf = binary, gguf

    def make(self, work: Path, index: int) -> LlamaServer:
        return LlamaServer(self.binary, self.gguf, work / f"l{index}.log")

    def backend_options(self, servers: list[LlamaServer]) -> dict:
        return {"context_length": 4096}

    @staticmethod
    def prompt_tokens(server: LlamaServer) -> float:
        """Prompt tokens it was given: those it processed and those its slots' caches served."""
        metrics = server.metrics()
        return metrics.get("llamacpp:prompt_tokens_total", float("nan")) + metrics.get(
            "llamacpp:prompt_tokens_cached_total", 0.0
        )

    @staticmethod
    def load(server: LlamaServer) -> float:
        """Requests in its slots and deferred for want of one."""
        metrics = server.metrics()
        return metrics["llamacpp:requests_processing"] + metrics["llamacpp:requests_deferred"]


class VllmStandIns:
    """Stand-ins for vLLM's servers (vllm_stand_in.py), in this process: routing by the KV-cache events they publish
    (their load: the requests each replica has in flight there; a stand-in has no /metrics)."""

    kind = "vllm"

    def make(self, work: Path, index: int) -> VllmStandIn:
        return VllmStandIn()

    def backend_options(self, servers: list[VllmStandIn]) -> dict:
        endpoints = [server.events_endpoint for server in servers]
        return {"context_length": 4096, "kv_events_endpoints": endpoints, "load_metrics_interval_s": 0}

    @staticmethod
    def prompt_tokens(server: VllmStandIn) -> float:
        return server.metrics()["prompt_tokens"]

    @staticmethod
    def load(server: VllmStandIn) -> float:
        return server.metrics()["in_flight"]


Kind = Engines | LlamaServers | VllmStandIns


class Fleet:
    """Model servers, two replicas and HAProxy, started for one configuration and stopped after it."""

    def __init__(
        self,
        work: Path,
        kind: Kind,
        servers: int,
        routing: bool,
        redis: RedisServer,
        quota: CpuQuota,
    ) -> None:
        self.work = work
        self.kind = kind
        self.quota = quota
        self.servers = [kind.make(work, i) for i in range(servers)]
        self.routing = routing
        self.redis = redis
        self.replicas: list[GatewayProcess] = []
        self.lb: subprocess.Popen | None = None
        self.port = free_port()

    def start(self) -> Fleet:
        for server in self.servers:
            server.launch()
            if server.process is not None:  # a stand-in runs in this process
                self.quota.confine(server.process.pid)  # its share of the CPUs, whatever the others do
        for server in self.servers:
            server.wait_ready(timeout_s=900)
        backend = {**self.kind.backend_options(self.servers), "prefix_routing": self.routing, "probe_interval_s": 1}
        env = {
            "GATEWAY_MODELS": MODEL,
            "GATEWAY_AUTH": "off",
            "GATEWAY_METRICS_PUBLIC": "1",
            "GATEWAY_REDIS_URL": self.redis.url,
            "GATEWAY_KEY_SECRET": "bench-fleet-secret",  # the replicas' tenants' cache_salt alike
            "GATEWAY_BACKEND": self.kind.kind,
            "GATEWAY_BACKEND_URLS": ",".join(s.url for s in self.servers),
            "GATEWAY_BACKEND_OPTIONS": json.dumps(backend),
        }
        self.replicas = [GatewayProcess(env, self.work / f"g{i}.log").start() for i in range(2)]
        lines = "\n".join(f"  server g{i} 127.0.0.1:{r.port}" for i, r in enumerate(self.replicas))
        config = self.work / "haproxy.cfg"
        config.write_text(
            "defaults\n  mode http\n  timeout connect 2s\n  timeout client 600s\n  timeout server 600s\n"
            f"frontend api\n  bind 127.0.0.1:{self.port}\n  default_backend gateways\n"
            f"backend gateways\n  balance roundrobin\n{lines}\n"
        )
        self.lb = subprocess.Popen([shutil.which("haproxy") or "/usr/sbin/haproxy", "-f", str(config)])
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "haproxy did not come up"
                time.sleep(0.1)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def prompt_tokens(self) -> list[float]:
        out = []
        for server in self.servers:
            try:
                out.append(self.kind.prompt_tokens(server))
            except OSError:
                out.append(float("nan"))
        return out

    def page_events(self) -> tuple[tuple[int, int], float]:
        """Over the replicas: (servers whose page events a replica follows in step, servers it follows), and the
        pages they say the servers published, from their /metrics."""
        in_step = followed = 0
        pages = 0.0
        for replica in self.replicas:
            text = urllib.request.urlopen(f"http://127.0.0.1:{replica.port}/metrics", timeout=5).read().decode()
            for line in text.splitlines():
                if line.startswith("gateway_upstream_page_events_in_sync{"):
                    followed += 1
                    in_step += float(line.rsplit(" ", 1)[1]) == 1
                elif line.startswith("gateway_upstream_prefix_pages{") and 'source="published"' in line:
                    pages += float(line.rsplit(" ", 1)[1])
        return (in_step, followed), pages

    def sample_load(self, loaded: threading.Event, done: threading.Event) -> list[float]:
        """Each server's requests in flight, read every LOAD_EVERY_S from `loaded` until `done`, averaged (a server
        that stopped answering counts from then on as empty)."""
        totals, samples = [0.0] * len(self.servers), 0
        while not done.wait(LOAD_EVERY_S):
            if not loaded.is_set():
                continue
            for index, server in enumerate(self.servers):
                with contextlib.suppress(OSError):
                    totals[index] += self.kind.load(server)
            samples += 1
        return [total / max(samples, 1) for total in totals]

    def stop(self) -> None:
        if self.lb is not None:
            self.lb.terminate()
            self.lb.wait(timeout=10)
        for process in (*self.replicas, *self.servers):
            process.stop()
        self.quota.release()


def run_workload(
    work: Path,
    kind: Kind,
    redis: RedisServer,
    workload: str,
    servers: int,
    routing: bool,
    quota: CpuQuota,
) -> Result:
    fleet = Fleet(work, kind, servers, routing, redis, quota).start()
    result = Result()
    done = threading.Event()
    with ThreadPoolExecutor(1) as sampler:
        loads = sampler.submit(fleet.sample_load, result.loaded, done)
        try:
            tag = f"{kind.kind[:2]}{workload[:3]}{servers}{int(routing)}".replace(" ", "")
            WORKLOADS[workload](fleet.url, result, tag)
            result.per_server = fleet.prompt_tokens()
            result.in_sync, result.published_pages = fleet.page_events()
        finally:
            done.set()
            result.load = loads.result()
            fleet.stop()
    return result


def run_killed(work: Path, kind: Engines, redis: RedisServer, routing: bool, quota: CpuQuota) -> Result:
    fleet = Fleet(work, kind, 3, routing, redis, quota).start()
    result = Result()
    halfway = threading.Event()
    try:
        worker = threading.Thread(target=chained, args=(fleet.url, result, f"kill{int(routing)}", halfway))
        worker.start()
        halfway.wait(timeout=600)
        fleet.servers[0].kill()
        worker.join()
        result.per_server = [value for value in fleet.prompt_tokens() if value == value]
    finally:
        fleet.stop()
    return result


CONFIGURATIONS = (("one server", 1, True), ("prefix", 3, True), ("least loaded", 3, False))
LLAMA_WORKLOADS = ("previous_response_id", "Chat Completions resend")  # where the index of what was sent counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--llama-cpp", type=Path, help="a llama.cpp source tree with build/bin/llama-server")
    parser.add_argument("--convert-python", default=sys.executable, help="a Python with llama.cpp's converter needs")
    parser.add_argument("--skip-engine", action="store_true", help="none of the engine's rows")
    parser.add_argument("--vllm-stand-in", action="store_true", help="the rows of stand-ins for vLLM's servers")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS),
                        help="the engine's workloads to run (a trial: --write needs them all)")  # fmt: skip
    parser.add_argument("--skip-killed", action="store_true", help="a trial: no run with a server killed")
    parser.add_argument("--killed-only", action="store_true", help="only the runs with a server killed (printed)")
    parser.add_argument("--server-cpus", type=float, default=SERVER_CPUS,
                        help="each model server's share of the CPUs, by a cgroup quota (0: unconfined)")  # fmt: skip
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    os.environ[KERNELS_ENV] = str(build_library())
    quota = CpuQuota(args.server_cpus)
    work = Path(tempfile.mkdtemp(prefix="fleet-routing-bench-"))
    config = replace(GPT_OSS_20B, num_hidden_layers=args.layers)
    redis = RedisServer(work / "redis").start()
    results: dict[tuple[str, str], Result] = {}
    llama: dict[tuple[str, str], Result] = {}
    vllm: dict[tuple[str, str], Result] = {}
    killed: dict[str, Result] = {}
    try:
        if not args.skip_engine:
            checkpoint = write_random_checkpoint(work / "model", config, "original", seed=4)
            options = {"checkpoint": str(checkpoint), "max_batch": 4, "max_positions": 4096,
                       "kv_cache_tokens": KV_CACHE_TOKENS, "threads": SERVER_THREADS}  # fmt: skip
            engines = Engines({**options, "cache_dir": str(work / "cache")})
            for workload in args.workloads if not args.killed_only else ():
                for label, servers, routing in CONFIGURATIONS:
                    results[(workload, label)] = run_workload(work, engines, redis, workload, servers, routing, quota)
                    result = results[(workload, label)]
                    loads = [round(v, 2) for v in result.load]
                    print(workload, label, result.cached, [round(v) for v in result.per_server], loads, flush=True)
            for label, routing in (("prefix", True), ("least loaded", False)) if not args.skip_killed else ():
                killed[label] = run_killed(work, engines, redis, routing, quota)
        if args.llama_cpp is not None:
            from llama_cpp_bench import to_gguf

            hf = write_random_checkpoint(work / "model-hf", config, "hf", seed=4)
            gguf = to_gguf(args.llama_cpp, args.convert_python, hf, work / "model.gguf", "f16")
            servers = LlamaServers(args.llama_cpp / "build" / "bin" / "llama-server", gguf)
            for workload in LLAMA_WORKLOADS:
                for label, count, routing in CONFIGURATIONS:
                    llama[(workload, label)] = run_workload(work, servers, redis, workload, count, routing, quota)
                    print("llama.cpp", workload, label, llama[(workload, label)].cached, flush=True)
        if args.vllm_stand_in:
            for workload in LLAMA_WORKLOADS:
                for label, count, routing in CONFIGURATIONS:
                    vllm[(workload, label)] = run_workload(work, VllmStandIns(), redis, workload, count, routing, quota)
                    print("vLLM stand-in", workload, label, vllm[(workload, label)].cached, flush=True)
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    if killed and not results:
        print(f"A server killed (SIGKILL) halfway through the previous_response_id workload: {_killings(killed)}.")
    sections = {}
    if results and (args.write is None or (args.workloads == list(WORKLOADS) and killed)):
        sections[NAME] = render_engines(results, killed, _setting(config.num_hidden_layers, quota), args.workloads)
    if llama:
        sections[LLAMA_NAME] = render_llama(llama, _setting(config.num_hidden_layers, quota))
    if vllm:
        sections[VLLM_NAME] = render_vllm(vllm)
    for name, section in sections.items():
        print(section)
        if args.write:
            write_section(args.write, name, section)
    return 0


def _compared(results: dict, workload: str) -> tuple[Result, Result, str]:
    """A workload's prefix and least-loaded runs, and their cache columns (each over the one-server run's)."""
    one, prefix, least = (results[(workload, label)] for label, _, _ in CONFIGURATIONS)
    reference = one.cached or 1
    return prefix, least, f"**{prefix.cached / reference:.2f}** | {least.cached / reference:.2f}"


def _balance(prefix: Result, least: Result) -> str:
    """The busiest columns: requests in flight, prefix and least loaded, then prompt tokens, both."""
    return f"{prefix.load_imbalance:.2f} | {least.load_imbalance:.2f} | {prefix.imbalance:.2f} / {least.imbalance:.2f}"


def _rows(results: dict, workloads: tuple[str, ...] | dict) -> list[str]:
    rows = []
    for workload in workloads:
        prefix, least, cache = _compared(results, workload)
        rows.append(
            f"| {workload} | {cache} | "
            f"{prefix.first_token(0.5) * 1000:.0f} / {prefix.first_token(0.9) * 1000:.0f} ms | "
            f"{least.first_token(0.5) * 1000:.0f} / {least.first_token(0.9) * 1000:.0f} ms | "
            f"**{least.first_token(0.5) / prefix.first_token(0.5):.2f}x** | {_later_turns(prefix, least)} | "
            f"{_balance(prefix, least)} |"
        )
    return rows


def _later_turns(prefix: Result, least: Result) -> str:
    """The turns after the openings, p50 and p90, prefix against least loaded ("-": requests of their own)."""
    if not any(sample.turn for sample in prefix.samples):
        return "-"
    ratios = [least.first_token(q, later=True) / prefix.first_token(q, later=True) for q in (0.5, 0.9)]
    return (
        f"{prefix.first_token(0.5, later=True) * 1000:.0f} / {prefix.first_token(0.9, later=True) * 1000:.0f} ms "
        f"against {least.first_token(0.5, later=True) * 1000:.0f} / {least.first_token(0.9, later=True) * 1000:.0f}"
        f" ms: {ratios[0]:.2f}x / {ratios[1]:.2f}x"
    )


HEADER = (
    "| workload | cache, prefix | cache, least loaded | first token, prefix | least loaded | ratio "
    "| later turns: prefix against least loaded, ratios | busiest, prefix | least loaded "
    "| prompt tokens, busiest: prefix / least loaded |",
    "|---|---|---|---|---|---|---|---|---|---|",
)


def _setting(layers: int, quota: CpuQuota) -> str:
    confined = (
        f"Each model server confined to {quota.cpus:g} of a CPU's time by a cgroup quota, so its share does not grow "
        "while another idles (as on a fleet whose servers have a machine each)."
        if quota.confined
        else "The model servers share the CPUs unconfined (no writable cgroup, or `--server-cpus 0`): one runs faster"
        " while another idles."
    )
    return (
        f"CPU: {cpu_line()}, {os.cpu_count()} CPUs, Python {platform.python_version()}. Three model servers and two "
        "gateway replicas on one Redis behind a round-robin HAProxy (a conversation's turns alternate between the "
        "replicas); each workload on fresh servers with prefix routing, with least-loaded routing "
        "(`prefix_routing: false`), and on one server alone, which holds everything: cache is the prompt tokens "
        "served from cache over that one server's. First token: p50 / p90 of the time from sending a request to "
        "its first token, reasoning or answer text, as the SDK client saw it (a JSON-schema answer); ratio: "
        "least loaded over prefix at p50; later turns: the same of the turns after the conversations' openings (an "
        "opening's prompt is held by no server under either routing), ratios at p50 and p90. Busiest: the busiest "
        "server's requests in flight (running and waiting, "
        f"read from its /metrics every {LOAD_EVERY_S} s and averaged over the run; for the shared system prompt, "
        "from when the users come at once: its first user, alone, is one request on one server under any routing) "
        "over the servers' mean; prompt "
        "tokens: the most prompt tokens a server was given (computed or served from its cache) over the mean. The "
        f"model: a random checkpoint of gpt-oss-20b's width at {layers} layer(s), on the CPU. "
        f"Conversations: {CONVERSATIONS} at a time, {TURNS} turns, shaped as an agent's session (an opening of "
        f"{FIRST_WORDS} words, ~{FIRST_WORDS * 7:,} tokens, then {LATER_WORDS} words a turn, each turn after a pause "
        f"drawn between 0 and {PAUSE_S} s, the same under every routing); the shared system "
        f"prompt: {USERS} users, the first alone, then {USERS_AT_ONCE} at a time. {confined}"
    )


def _killings(killed: dict) -> str:
    return "; ".join(
        f"{label}: {result.failed} of {len(result.samples)} requests failed, {result.failed_streaming} of them after "
        "their first token had streamed"
        for label, result in killed.items()
    )


def render_engines(results: dict, killed: dict, setting: str, workloads: list[str]) -> str:
    start, end = markers(NAME)
    killings = _killings(killed)
    return "\n".join([
        start,
        "## Routing by prefix over a fleet (`bench/fleet_routing_bench.py`)",
        "",
        setting,
        "",
        f"The built-in engine's servers (`serve-engine`, float32, `max_batch` 4, {SERVER_THREADS} intra-op thread "
        f"each, a pool of {KV_CACHE_TOKENS:,} positions; routing by their published pages).",
        "",
        *HEADER,
        *_rows(results, workloads),
        "",
        f"A server killed (SIGKILL) halfway through the previous_response_id workload: {killings}.",
        end,
    ])  # fmt: skip


def render_llama(llama: dict, setting: str) -> str:
    start, end = markers(LLAMA_NAME)
    return "\n".join([
        start,
        "## Routing by prefix over a fleet of llama.cpp servers (`bench/fleet_routing_bench.py --llama-cpp`)",
        "",
        setting,
        "",
        "llama.cpp's `llama-server` (built from source, the same checkpoint converted by its own converter, f16, "
        "2 slots, 1 thread each; routing by what was sent where). Busiest: by `llamacpp:requests_processing` + "
        "`llamacpp:requests_deferred`; prompt tokens: `llamacpp:prompt_tokens_total` + "
        "`llamacpp:prompt_tokens_cached_total`.",
        "",
        *HEADER,
        *_rows(llama, LLAMA_WORKLOADS),
        end,
    ])  # fmt: skip


def _stand_in_row(vllm: dict, workload: str) -> str:
    prefix, least, cache = _compared(vllm, workload)
    followed = f"{prefix.in_sync[0]} of {prefix.in_sync[1]}; {prefix.published_pages:,.0f}"
    return f"| {workload} | {cache} | {prefix.failed} / {least.failed} | {_balance(prefix, least)} | {followed} |"


def render_vllm(vllm: dict) -> str:
    start, end = markers(VLLM_NAME)
    return "\n".join([
        start,
        "## Routing by vLLM's KV-cache events, over stand-ins (`bench/fleet_routing_bench.py --vllm-stand-in`)",
        "",
        f"CPU: {cpu_line()}, {os.cpu_count()} CPUs, Python {platform.python_version()}. The same fleet, workloads and "
        "configurations as above (two gateway replicas on one Redis behind a round-robin HAProxy, `vllm` backend), "
        "over three stand-ins for vLLM's server (`bench/vllm_stand_in.py`): each keeps a prefix cache of 16-token "
        "blocks named by a hash chain from a seed of its own (the first block with the request's `cache_salt`), "
        "reports `cached_tokens` as vLLM does and publishes its blocks stored and evicted as vLLM's "
        "`--kv-events-config` does (ZMQ, msgpack); the replicas route by those events "
        "(`kv_events_endpoints`), their block names recomputed from the token ids. A stand-in computes nothing: a "
        f"prompt token it does not hold costs {PREFILL_S_PER_TOKEN * 1000:g} ms, one prompt at a time, and an "
        f"answer token {TOKEN_DELAY_S * 1000:g} ms; so only the cache and the balance are reported. Busiest: each "
        "stand-in's requests in flight, averaged over the run, over the mean; prompt tokens: the most a stand-in "
        "was given over the mean; events followed: at the end of the prefix run, the stand-ins whose events each "
        "replica follows in step (`gateway_upstream_page_events_in_sync`) of those it follows, and the blocks they "
        "say the stand-ins hold (`gateway_upstream_prefix_pages{source=\"published\"}`, summed over the replicas).",
        "",
        "| workload | cache, prefix | cache, least loaded | requests failed: prefix / least loaded | busiest, prefix "
        "| least loaded | prompt tokens, busiest: prefix / least loaded | prefix: events followed in step, pages "
        "published |",
        "|---|---|---|---|---|---|---|---|",
        *(_stand_in_row(vllm, workload) for workload in LLAMA_WORKLOADS),
        end,
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
