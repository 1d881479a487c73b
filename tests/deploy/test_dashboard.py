"""Every series the Grafana dashboard queries is one a live gateway exports, with the labels it uses, and
every series the gateway exports has a panel."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import openai
import pytest
from engine_fixtures import make_checkpoint, tiny_config
from engine_servers import EngineServer
from gateway_fixtures import KEY_SECRET, write_keys, write_script
from live_gateway import FailingBackend, LiveGateway
from paths import CHART
from prometheus_client.parser import text_string_to_metric_families
from redis_servers import RedisServer

from gateway.config import Settings

DASHBOARD = CHART / "dashboards" / "gpt-oss-gateway.json"
MODEL = "gpt-oss-120b"
BROKEN_MODEL = "gpt-oss-broken"
ENGINE_MODEL = "gpt-oss-20b"
REMOTE_MODEL = "gpt-oss-remote"  # served by an engine server: the routing series
KEYS = {"sk-dash-acme": "acme", "sk-dash-beta": "beta"}
TARGET_LABELS = {"pod", "instance", "job", "namespace"}  # added by Prometheus when it scrapes
METRIC = re.compile(r"\b(gateway_[a-z0-9_]+)(\{[^}]*\})?")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\((gateway_[a-z0-9_]+),\s*([a-zA-Z_]+)\)")


def _queries(dashboard: dict) -> list[str]:
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    expressions = [target["expr"] for panel in panels for target in panel["targets"]]
    variables = [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return expressions + variables


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """Sample name → label names, scraped from a gateway after traffic that touches every series."""
    directory = tmp_path_factory.mktemp("dashboard")
    redis = RedisServer(directory / "redis").start()
    engine = {"checkpoint": str(make_checkpoint(directory / "model", tiny_config(), "original"))}
    server = EngineServer({**engine, "cache_dir": str(directory)}, directory / "engine-server.log").start()
    settings = Settings(
        backends={
            "scripted": {"kind": "mock", "options": {"script": str(write_script(directory))}, "models": [MODEL]},
            "broken": {"kind": "mock", "models": [BROKEN_MODEL]},
            "engine": {"kind": "onnx", "options": {**engine, "cache_dir": str(directory)}, "models": [ENGINE_MODEL]},
            "remote": {"kind": "engine", "options": {"urls": [server.url]}, "models": [REMOTE_MODEL]},
        },
        key_secret=KEY_SECRET,
        keys_file=str(write_keys(directory, KEYS)),
        redis_url=redis.url,
        metrics_public=True,
        limits={"tenants": {"beta": {"requests_per_minute": 1}}},
    )
    live = LiveGateway(settings).start()
    try:
        live.services.backends[BROKEN_MODEL] = FailingBackend(live.services.encoding)
        live.wait_until_ready(ENGINE_MODEL)
        acme = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-dash-acme", max_retries=0)
        beta = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-dash-beta", max_retries=0)
        list(acme.responses.create(model=MODEL, input="thanks", stream=True))
        acme.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "thanks"}])
        acme.responses.create(model=BROKEN_MODEL, input="thanks")
        acme.responses.create(model=ENGINE_MODEL, input="thanks", max_output_tokens=16)
        acme.responses.create(model=REMOTE_MODEL, input="thanks", max_output_tokens=16)
        with acme.responses.connect() as socket:
            socket.response.create(model=MODEL, input="thanks")
            assert any(event.type == "response.completed" for event in socket)
        beta.responses.create(model=MODEL, input="thanks")
        with pytest.raises(openai.RateLimitError):
            beta.responses.create(model=MODEL, input="thanks")
        redis.stop()
        with pytest.raises(openai.InternalServerError):
            acme.responses.retrieve("resp_gone")  # the store is down: a 503 and a store error
        with urllib.request.urlopen(live.url + "/metrics", timeout=10) as scrape:
            text = scrape.read().decode()
    finally:
        live.stop()
        redis.stop()
        server.stop()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def test_every_queried_series_and_label_is_exported(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _queries(dashboard)
    assert len(queries) >= 30
    for query in queries:
        names = [match.group(1) for match in METRIC.finditer(query)]
        assert names, f"a query on no gateway series: {query}"
        known = set()
        for match in METRIC.finditer(query):
            name, matchers = match.group(1), match.group(2) or ""
            assert name in exported, f"{name} is queried but not exported"
            for label in MATCHER_LABEL.findall(matchers):
                assert label in exported[name], f"{name} has no label {label!r} ({query})"
            known |= exported[name]
        for grouping in GROUPING.findall(query):
            for label in filter(None, (part.strip() for part in grouping.split(","))):
                assert label in known | TARGET_LABELS, f"grouping by {label!r}, which {names} lack: {query}"
        for name, label in LABEL_VALUES.findall(query):
            assert label in exported[name]


def test_every_exported_series_has_a_panel(exported):
    text = json.dumps(_queries(json.loads(DASHBOARD.read_text())))
    families = {re.sub(r"_(bucket|count|sum|created|total)$", "", name) for name in exported}
    families = {name for name in families if name.startswith("gateway_")}
    assert len(families) == 38
    unused = [name for name in sorted(families) if name not in text]
    assert not unused, f"exported but on no panel: {unused}"
