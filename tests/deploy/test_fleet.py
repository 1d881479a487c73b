"""Fleet rehearsal: three `serve` replicas on one redis-server behind a real HAProxy, scraped by a real
Prometheus. Under continuous streamed and tool-loop load the replicas are restarted one by one with SIGTERM
(0 failed requests, 0 cut streams); then one is SIGKILLed (only its own streams are cut, and its running
records read as failed on the others within the lease). Every query of the shipped Grafana dashboard and
of the shipped alert rules then evaluates in Prometheus and returns series."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
import yaml
from engine_fixtures import make_checkpoint, tiny_config
from engine_servers import EngineServer
from gateway_fixtures import ANALYSIS_WEATHER, KEY_SECRET, WEATHER_TOOL, write_keys
from live_gateway import GatewayProcess
from paths import CHART
from redis_servers import RedisServer, free_port

MODEL = "gpt-oss-120b"
ENGINE_MODEL = "gpt-oss-20b"
REMOTE_MODEL = "gpt-oss-remote"  # served by an engine server: the routing panels
LEASE_S = 2.0
STEPS = " ".join(f"step{i}" for i in range(30))
SCRIPT = {
    "rules": [
        {
            "match": {"user": "weather"},
            "emit": [{"analysis": ANALYSIS_WEATHER}, {"tool_call": {"name": "get_weather", "arguments": {"c": 1}}}],
        },
        {"match": {"tool": "sunny"}, "emit": [{"final": "It is sunny."}]},
        {"match": {"user": "slowly"}, "token_delay_ms": 25, "emit": [{"analysis": STEPS}, {"final": "done"}]},
        {"emit": [{"final": "ok"}]},
    ]
}


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    assert found, f"{name} is not installed (Debian package; .ci/run installs it)"
    return found


@dataclass
class Replica:
    name: str
    port: int
    metrics_port: int
    env: dict[str, str]
    directory: Path
    generation: int = 0
    process: GatewayProcess | None = None

    def start(self) -> Replica:
        self.generation += 1
        env = {**self.env, "GATEWAY_METRICS_PORT": str(self.metrics_port)}
        log = self.directory / f"{self.name}-{self.generation}.log"
        self.process = GatewayProcess(env, log, port=self.port).start(timeout_s=30)
        return self

    def drain(self) -> None:
        assert self.process is not None and self.process.process is not None
        self.process.process.send_signal(signal.SIGTERM)
        assert self.process.process.wait(timeout=40) == 0

    def kill(self) -> None:
        assert self.process is not None and self.process.process is not None
        self.process.process.kill()
        self.process.process.wait(timeout=10)


@dataclass
class Tally:
    """What the load saw, by the replica that served it (HAProxy's X-Served-By)."""

    ok: int = 0
    failures: list[str] = field(default_factory=list)
    cut_by: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, failure: str | None = None, served_by: str | None = None) -> None:
        with self.lock:
            if failure is None:
                self.ok += 1
            elif served_by is not None:
                self.cut_by[served_by] = self.cut_by.get(served_by, 0) + 1
            else:
                self.failures.append(failure)


def _stream_once(client: openai.OpenAI, tally: Tally) -> None:
    served_by = None
    try:
        raw = client.responses.with_raw_response.create(model=MODEL, input="answer slowly", stream=True)
        served_by = raw.headers.get("X-Served-By")
        events = [event.type for event in raw.parse()]
        if events[-1] != "response.completed":
            tally.count(f"stream ended with {events[-1]}", served_by)
            return
        tally.count()
    except Exception as exc:
        tally.count(f"stream: {type(exc).__name__}: {exc}", served_by)


def _tool_loop_once(client: openai.OpenAI, tally: Tally) -> None:
    try:
        first = client.responses.create(model=MODEL, input="weather?", tools=[WEATHER_TOOL])
        call = first.output[-1]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        second = client.responses.create(model=MODEL, previous_response_id=first.id, input=[output])
        assert second.output_text == "It is sunny.", second.output_text
        tally.count()
    except Exception as exc:
        tally.count(f"tool loop: {type(exc).__name__}: {exc}")


class Load:
    def __init__(self, url: str, workers: int = 6) -> None:
        self.tally = Tally()
        self._stop = threading.Event()
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-fleet", max_retries=0, timeout=60)
        self._threads = [
            threading.Thread(target=self._work, args=(client, _stream_once if i % 2 else _tool_loop_once))
            for i in range(workers)
        ]

    def _work(self, client: openai.OpenAI, once) -> None:
        while not self._stop.is_set():
            once(client, self.tally)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


def _haproxy_config(port: int, stats_port: int, replicas: list[Replica]) -> str:
    servers = "\n".join(f"  server {r.name} 127.0.0.1:{r.port} check" for r in replicas)
    return f"""global
  maxconn 2000
defaults
  mode http
  timeout connect 2s
  timeout client 90s
  timeout server 90s
  option http-buffer-request
  retries 3
  retry-on conn-failure empty-response 503
  option redispatch 1
frontend api
  bind 127.0.0.1:{port}
  default_backend gateways
frontend stats
  bind 127.0.0.1:{stats_port}
  stats enable
  stats uri /stats
backend gateways
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  timeout check 2s
  default-server inter 200ms fall 2 rise 2
  http-response set-header X-Served-By %s
{servers}
"""


def _wait_until_up(stats_url: str, replicas: list[Replica], timeout_s: float = 20) -> None:
    """Until HAProxy's own health checks count every replica UP (its CSV statistics say so)."""
    names = {replica.name for replica in replicas}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(stats_url + "/stats;csv", timeout=2) as response:
                rows = response.read().decode().splitlines()
            header = rows[0].lstrip("# ").split(",")
            up = {
                row["svname"]
                for row in (dict(zip(header, line.split(","), strict=False)) for line in rows[1:])
                if row.get("pxname") == "gateways" and row.get("status") == "UP"
            }
            if names <= up:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"HAProxy does not count {sorted(names)} up"
        time.sleep(0.1)


def _prometheus_config(replicas: list[Replica], rules: Path) -> str:
    targets = [f"127.0.0.1:{r.metrics_port}" for r in replicas]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "gpt-oss-gateway", "static_configs": [{"targets": targets, "labels": {"namespace": "t"}}]}
        ],
    }
    return yaml.safe_dump(config)


def _query(prometheus: str, expr: str) -> dict:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((CHART / "dashboards" / "gpt-oss-gateway.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    values = {"$__rate_interval": "30s", "$topn": "5", "$model": ".*", "$tenant": ".*", "$route": ".*"}
    queries = []
    for expr in (target["expr"] for panel in panels for target in panel["targets"]):
        for name, value in values.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, expr
        queries.append(expr)
    return queries


def _alert_queries(rules: Path) -> list[str]:
    """Each alert's expression with its last comparison made `bool`: a series whether or not it fires."""
    exprs = [rule["expr"] for group in yaml.safe_load(rules.read_text())["groups"] for rule in group["rules"]]
    return [re.sub(r"(>|<|>=|<=|==|!=)(\s*[0-9.e-]+\s*)$", r"\1 bool\2", expr.strip()) for expr in exprs]


def test_rolling_restart_then_a_crash_under_load(tmp_path):
    haproxy, prometheus_bin = _binary("haproxy"), _binary("prometheus")
    redis = RedisServer(tmp_path / "redis").start()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    checkpoint = make_checkpoint(tmp_path / "model", tiny_config(), "original")
    engine = {"checkpoint": str(checkpoint), "cache_dir": str(tmp_path / "engine-cache")}
    engine_server = EngineServer(engine, tmp_path / "engine-server.log").start()  # for the routing panels
    env = {
        "GATEWAY_REDIS_URL": redis.url,
        "GATEWAY_BACKENDS": json.dumps(
            {
                "scripted": {"kind": "mock", "options": {"script": str(script)}, "models": [MODEL]},
                "engine": {"kind": "onnx", "options": engine, "models": [ENGINE_MODEL]},  # for the engine panels
                "remote": {"kind": "engine", "options": {"urls": [engine_server.url]}, "models": [REMOTE_MODEL]},
            }
        ),
        "GATEWAY_RECORD_LEASE_S": str(LEASE_S),
        "GATEWAY_DRAIN_S": "30",
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(tmp_path, {"sk-fleet": "fleet", "sk-tight": "tight"})),
        "GATEWAY_LIMITS": json.dumps({"tenants": {"tight": {"requests_per_minute": 1}}}),
    }
    replicas = [Replica(f"g{i}", free_port(), free_port(), env, tmp_path).start() for i in range(3)]
    lb_port, stats_port = free_port(), free_port()
    (tmp_path / "haproxy.cfg").write_text(_haproxy_config(lb_port, stats_port, replicas))
    lb = subprocess.Popen([haproxy, "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.PIPE)
    rules = CHART / "alerts" / "gpt-oss-gateway.rules.yaml"
    (tmp_path / "prometheus.yml").write_text(_prometheus_config(replicas, rules))
    prom_port = free_port()
    prometheus = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{lb_port}"
    try:
        stats = f"http://127.0.0.1:{stats_port}"
        _wait_until_up(stats, replicas)

        with Load(url) as load:  # phase 1: a rolling restart, each replica drained with SIGTERM
            time.sleep(2)
            for replica in replicas:
                replica.drain()
                replica.start()
                _wait_until_up(stats, replicas)  # before the next one goes
            time.sleep(2)
        assert load.tally.failures == [] and load.tally.cut_by == {}, (load.tally.failures, load.tally.cut_by)
        assert load.tally.ok > 30

        victim = replicas[0]
        direct = openai.OpenAI(base_url=victim.process.url + "/v1", api_key="sk-fleet", max_retries=0)
        orphan = direct.responses.create(model=MODEL, input="answer slowly", background=True)
        with Load(url) as load:  # phase 2: one replica crashes
            time.sleep(1.5)
            victim.kill()
            killed_at = time.monotonic()
            time.sleep(4)
        assert load.tally.failures == [], load.tally.failures  # what the killed replica did not serve
        assert set(load.tally.cut_by) <= {victim.name}, load.tally.cut_by
        survivor = openai.OpenAI(base_url=url + "/v1", api_key="sk-fleet", max_retries=0)
        while (record := survivor.responses.retrieve(orphan.id)).status != "failed":
            assert time.monotonic() - killed_at < LEASE_S + 2, record.status
            time.sleep(0.1)
        assert record.error.code == "server_error"

        prom = f"http://127.0.0.1:{prom_port}"
        fleet = openai.OpenAI(base_url=url + "/v1", api_key="sk-fleet", max_retries=0, timeout=60)
        assert fleet.responses.create(model=ENGINE_MODEL, input="hi", max_output_tokens=16).output
        assert fleet.responses.create(model=REMOTE_MODEL, input="hi", max_output_tokens=16).output
        with fleet.responses.connect() as socket:  # through HAProxy: for the WebSocket panels
            socket.response.create(model=MODEL, input="hi")
            assert any(event.type == "response.completed" for event in socket)
        tight = openai.OpenAI(base_url=url + "/v1", api_key="sk-tight", max_retries=0)
        tight.responses.create(model=MODEL, input="hi")
        with pytest.raises(openai.RateLimitError):  # a limiter refusal, for the panels and the alert on them
            tight.responses.create(model=MODEL, input="hi")
        time.sleep(2.5)  # scraped
        empty = []
        for query in _dashboard_queries() + _alert_queries(rules):
            answer = _query(prom, query)
            assert answer["status"] == "success", query
            if not answer["data"]["result"]:
                empty.append(query)
        assert empty == [], "\n".join(empty)
        with urllib.request.urlopen(prom + "/api/v1/rules", timeout=10) as response:
            groups = json.load(response)["data"]["groups"]
        assert [rule["health"] for group in groups for rule in group["rules"]] == ["ok"] * 6
    finally:
        for process in (lb, prometheus):
            process.terminate()
            process.wait(timeout=10)
        for replica in replicas:
            if replica.process is not None:
                replica.process.stop()
        engine_server.stop()
        redis.stop()
