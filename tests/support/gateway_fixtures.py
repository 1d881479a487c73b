"""Fixtures for API tests: a mock script, a redis-server per session, a live gateway per store kind."""

from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from live_gateway import LiveGateway
from redis_servers import RedisServer

from gateway.config import Settings
from state.keys import KeyRecord, hash_key

ANALYSIS_WEATHER = "The user wants the weather in Paris, so I will call get_weather."
ANALYSIS_AFTER_TOOL = "The tool reported sunny weather; I can answer now."
ANALYSIS_THANKS = "The user is thanking me."
LONG_TEXT = " ".join(["word"] * 200)
SLOW_TEXT = " ".join(["step"] * 40)
TEST_KEYS = "k2:" + base64.b64encode(bytes(range(32))).decode()

SCRIPT = {
    "rules": [
        {
            "match": {"user": "weather"},
            "emit": [
                {"analysis": ANALYSIS_WEATHER},
                {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {
            "match": {"tool": "sunny"},
            "emit": [{"analysis": ANALYSIS_AFTER_TOOL}, {"final": "It is sunny in Paris."}],
        },
        {"match": {"user": "thanks"}, "emit": [{"analysis": ANALYSIS_THANKS}, {"final": "You are welcome."}]},
        {
            "match": {"user": "Ada"},
            "emit": [{"analysis": "Extract the person."}, {"final": '{"name": "Ada", "age": 36}'}],
        },
        {"match": {"user": "essay"}, "emit": [{"analysis": LONG_TEXT}, {"final": LONG_TEXT}]},
        {
            "match": {"user": "slowly"},
            "token_delay_ms": 40,
            "emit": [{"analysis": SLOW_TEXT}, {"final": "done slowly"}],
        },
        {"match": {"user": "pause"}, "token_delay_ms": 300, "emit": [{"final": "ok"}]},
        {"emit": [{"analysis": "Just say hello."}, {"final": "Hello from the mock."}]},
    ]
}

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


KEY_SECRET = "test-key-secret-not-for-production"
TEST_API_KEYS = {  # key → tenant, for the gateway fixture's keys file
    "sk-tenant-a": "tenant-a",
    "sk-tenant-b": "tenant-b",
    "sk-chat-a": "chat-a",
    "sk-chat-b": "chat-b",
    "sk-agents": "agents",
    "sk-test": "test",
    "sk-x": "x",
    "sk-http": "http",
}
HTTP_AUTH = {"Authorization": "Bearer sk-http"}


def write_keys(directory: Path, keys: dict[str, str] | None = None) -> Path:
    """A keys file as `gpt-oss-gateway keys create --file` writes it: hashes, never the keys."""
    records = [
        asdict(KeyRecord(f"key_{i}", tenant, "test", 0, hash_key(KEY_SECRET.encode(), key)))
        for i, (key, tenant) in enumerate((keys or TEST_API_KEYS).items())
    ]
    path = directory / "keys.json"
    path.write_text(json.dumps({"keys": records}))
    return path


def write_script(directory: Path, script: dict | None = None) -> Path:
    path = directory / "mock_script.json"
    path.write_text(json.dumps(script or SCRIPT))
    return path


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis-api")).start()
    yield server
    server.stop()


def flush(server: RedisServer) -> None:
    subprocess.run(["redis-cli", "-p", str(server.port), "flushall"], check=True, capture_output=True, timeout=10)


def gateway_settings(tmp_path: Path, script: dict | None = None, **overrides: Any) -> Settings:
    """Settings of a test gateway: the mock with `script` (the shared SCRIPT by default), the test keys."""
    return Settings(
        mock_script=str(write_script(tmp_path, script)),
        reasoning_keys=TEST_KEYS,
        key_secret=KEY_SECRET,
        keys_file=str(write_keys(tmp_path)),
        **overrides,
    )


def start_live_gateway(request, tmp_path: Path, script: dict | None = None) -> LiveGateway:
    """A live gateway with a mock script (the shared SCRIPT by default), on the store `request.param` names:
    the in-memory store or the session's redis-server (flushed)."""
    settings = gateway_settings(tmp_path, script, keepalive_s=0.2)
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        flush(server)
        settings = settings.model_copy(update={"redis_url": server.url})
    return LiveGateway(settings).start()


@pytest.fixture(params=["memory", "redis"])
def gateway(request, tmp_path):
    """A live gateway with the mock script, on the in-memory store and on a real redis-server."""
    live = start_live_gateway(request, tmp_path)
    yield live
    live.stop()
