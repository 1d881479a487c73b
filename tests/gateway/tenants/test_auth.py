"""API keys and tenants: keys hashed at rest (file or Redis, managed by the CLI), 401s, tenant isolation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest
from gateway_fixtures import ANALYSIS_WEATHER, KEY_SECRET, SCRIPT, WEATHER_TOOL, flush, write_keys, write_script
from live_gateway import LiveGateway
from redis_servers import RedisServer

import gateway.tenants.auth
from gateway.config import Settings
from gateway.services import ConfigError, build_services
from harmony import Renderer, load_harmony_encoding

MODEL = "gpt-oss-120b"
KEYS = {"sk-acme-1": "acme", "sk-acme-2": "acme", "sk-rival": "rival"}


def _client(live: LiveGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture
def keyed(tmp_path):
    settings = Settings(
        mock_script=str(write_script(tmp_path)), key_secret=KEY_SECRET, keys_file=str(write_keys(tmp_path, KEYS))
    )
    live = LiveGateway(settings).start()
    yield live
    live.stop()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_requests_without_a_valid_key_get_401(keyed):
    for key in ("sk-unknown", "x" * 300):
        with pytest.raises(openai.AuthenticationError) as info:
            _client(keyed, key).responses.create(model=MODEL, input="hi")
        assert info.value.body["code"] == "invalid_api_key" and info.value.status_code == 401
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}):
        request = urllib.request.Request(keyed.url + "/v1/models", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as failure:
            urllib.request.urlopen(request, timeout=5)
        assert failure.value.code == 401
        assert json.loads(failure.value.read())["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _client(keyed, "sk-unknown").models.list()
    with urllib.request.urlopen(keyed.url + "/healthz", timeout=5) as response:
        assert response.status == 200  # probes need no key
    assert _client(keyed, "sk-acme-1").responses.create(model=MODEL, input="hi").status == "completed"


def test_two_tenants_cannot_reach_each_others_responses_or_cot(keyed):
    acme, acme_other_key, rival = (_client(keyed, key) for key in KEYS)
    first = acme.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL])
    call = next(item for item in first.output if item.type == "function_call")
    background = acme.responses.create(model=MODEL, input="go slowly", background=True)

    assert acme_other_key.responses.retrieve(first.id).id == first.id  # the same tenant, another key
    for attempt in (
        lambda: rival.responses.retrieve(first.id),
        lambda: rival.responses.input_items.list(first.id),
        lambda: rival.responses.delete(first.id),
        lambda: rival.responses.cancel(background.id),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    with pytest.raises(openai.BadRequestError) as continued:  # as for an id that never existed
        rival.responses.create(model=MODEL, previous_response_id=first.id, input="thanks")
    assert continued.value.code == "previous_response_not_found"

    # the chat CoT index: the rival replays acme's call id and gets none of acme's reasoning
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        ],
    }
    messages = [{"role": "user", "content": "What is the weather in Paris?"}, assistant]
    messages.append({"role": "tool", "tool_call_id": call.call_id, "content": "sunny"})
    rival.chat.completions.create(model=MODEL, messages=messages)
    assert ANALYSIS_WEATHER not in keyed.backend.prompt_text()
    acme_other_key.chat.completions.create(model=MODEL, messages=messages)
    assert ANALYSIS_WEATHER in keyed.backend.prompt_text()  # the owner's tenant recovers it
    assert acme.responses.retrieve(first.id).status == "completed"  # the rival's delete did nothing


def test_keys_made_by_the_cli_in_redis_work_and_revoke(redis_server, tmp_path, monkeypatch):
    flush(redis_server)
    monkeypatch.setattr(gateway.tenants.auth, "KEY_CACHE_S", 0.2)
    env = {"GATEWAY_REDIS_URL": redis_server.url, "GATEWAY_KEY_SECRET": KEY_SECRET}
    made = _cli("create", "--tenant", "team-1", "--name", "ci", env=env)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["key"].startswith("sk-") and len(created["key"]) > 40 and created["tenant"] == "team-1"
    stored = subprocess.run(
        ["redis-cli", "-p", str(redis_server.port), "--scan"], capture_output=True, text=True, check=True
    ).stdout
    assert created["key"] not in stored  # only the HMAC is kept
    listed = [json.loads(line) for line in _cli("list", env=env).stdout.splitlines()]
    assert listed == [{k: created[k] for k in ("id", "tenant", "name", "created_at")}]

    settings = Settings(mock_script=str(write_script(tmp_path)), key_secret=KEY_SECRET, redis_url=redis_server.url)
    live = LiveGateway(settings).start()
    try:
        api = _client(live, created["key"])
        assert api.responses.create(model=MODEL, input="hi").status == "completed"
        assert _cli("revoke", created["id"], env=env).returncode == 0
        time.sleep(0.3)
        with pytest.raises(openai.AuthenticationError):
            api.responses.create(model=MODEL, input="hi")
    finally:
        live.stop()
    assert _cli("revoke", created["id"], env=env).returncode == 1
    assert _cli("create", "--tenant", "bad tenant!", env=env).returncode == 2


def test_an_unreachable_key_store_fails_closed(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    env = {"GATEWAY_REDIS_URL": server.url, "GATEWAY_KEY_SECRET": KEY_SECRET}
    key = json.loads(_cli("create", "--tenant", "t", env=env).stdout)["key"]
    settings = Settings(mock_script=str(write_script(tmp_path)), key_secret=KEY_SECRET, redis_url=server.url)
    live = LiveGateway(settings).start()
    try:
        server.stop()
        request = urllib.request.Request(
            live.url + "/v1/models", headers={"Authorization": f"Bearer {key}-not-cached"}, method="GET"
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 503
        assert json.loads(info.value.read())["error"]["code"] == "service_unavailable"
    finally:
        live.stop()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"host": "0.0.0.0"}, "serving on 0.0.0.0 without API keys"),
        ({"auth": "keys"}, "GATEWAY_KEY_SECRET"),
        ({"auth": "keys", "key_secret": "short"}, "GATEWAY_KEY_SECRET"),
        ({"key_secret": KEY_SECRET}, "GATEWAY_KEYS_FILE or GATEWAY_REDIS_URL"),
    ],
)
def test_unsafe_or_incomplete_auth_settings_refuse_to_start(changes, message):
    with pytest.raises(ConfigError) as info:
        build_services(Settings(**changes), Renderer(load_harmony_encoding()))
    assert message in str(info.value)


def test_auth_off_is_one_default_tenant_on_loopback(tmp_path):
    live = LiveGateway(Settings(mock_script=str(write_script(tmp_path, SCRIPT)))).start()
    try:
        created = _client(live, "sk-anything").responses.create(model=MODEL, input="hi")
        assert _client(live, "sk-other").responses.retrieve(created.id).id == created.id
    finally:
        live.stop()
