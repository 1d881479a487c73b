"""Backends from entry points: several backends and models in one gateway, and a third-party plugin."""

from __future__ import annotations

import json
import textwrap

import openai
import pytest
from live_gateway import LiveGateway

from backends.registry import GROUP, installed
from gateway.config import Settings
from gateway.services import ConfigError, build_services
from harmony import Renderer


def _answers(text: str) -> dict:
    return {"rules": [{"emit": [{"analysis": "thinking"}, {"final": text}]}]}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A package installed the way pip leaves one: a module plus a dist-info declaring the entry point."""
    (tmp_path / "echo_plugin.py").write_text(
        textwrap.dedent(
            """
            from backends.mock import MockBackend

            def create(options, encoding):
                return MockBackend({"rules": [{"emit": [{"final": "plugin says " + options["word"]}]}]}, encoding)
            """
        )
    )
    info = tmp_path / "echo_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\necho = echo_plugin:create\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "echo"


def test_the_mock_is_an_installed_entry_point():
    assert installed()["mock"].value == "backends.mock:from_options"


def test_several_backends_and_a_plugin_serve_their_models(plugin):
    backends = {
        "first": {"kind": "mock", "options": _answers("from first"), "models": ["gpt-oss-120b"]},
        "second": {"kind": "mock", "options": _answers("from second"), "models": ["gpt-oss-20b", "small"]},
        "third": {"kind": plugin, "options": {"word": "hi"}, "models": ["plugged"]},
    }
    live = LiveGateway(Settings(backends=backends)).start()
    try:
        api = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-x", max_retries=0)
        assert [m.id for m in api.models.list().data] == ["gpt-oss-120b", "gpt-oss-20b", "small", "plugged"]
        for model, text in (("gpt-oss-120b", "from first"), ("small", "from second"), ("plugged", "plugin says hi")):
            assert api.responses.create(model=model, input="q").output_text == text
            chat = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "q"}])
            assert chat.choices[0].message.content == text
    finally:
        live.stop()


def test_backends_come_from_the_environment_as_json(monkeypatch):
    config = {"main": {"kind": "mock", "options": _answers("x"), "models": ["m1"]}}
    monkeypatch.setenv("GATEWAY_BACKENDS", json.dumps(config))
    assert Settings().backend_configs()["main"].models == ["m1"]


@pytest.mark.parametrize(
    "backends,message",
    [
        ({"a": {"kind": "vllm-nope", "models": ["m"]}}, "backends.a: no backend 'vllm-nope' is installed"),
        (
            {"a": {"kind": "mock", "models": ["m"]}, "b": {"kind": "mock", "models": ["m"]}},
            "backends.b: model 'm' is already served",
        ),
    ],
)
def test_bad_backend_configuration_is_refused_with_the_place(backends, message, renderer: Renderer):
    with pytest.raises(ConfigError, match=message):
        build_services(Settings(backends=backends), renderer)
