"""The scripted mock backend: rule matching, Harmony output, limits, stops, delays, recorded prompts."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from backends.base import Backend, Chunk, GenerateRequest, Sampling
from backends.mock import MockBackend, ScriptError
from harmony import Message, Renderer, Role, parse_completion
from harmony.tokens import CALL, RETURN, STOP_TOKENS_FOR_ASSISTANT_ACTIONS

SCRIPT = {
    "rules": [
        {
            "match": {"user": "(?i)weather"},
            "emit": [
                {"analysis": "Need the weather tool."},
                {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {"match": {"tool": "sunny"}, "emit": [{"analysis": "It is sunny."}, {"final": "Sunny in Paris ☀️"}]},
        {"emit": [{"commentary": "Working on it."}, {"final": "Hello!"}]},
    ]
}


def _request(prompt: list[int], max_new_tokens: int = 512, stops=STOP_TOKENS_FOR_ASSISTANT_ACTIONS) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, max_new_tokens=max_new_tokens, stop_ids=tuple(stops), request_id="r1")


async def _collect(backend, request) -> list[int]:
    tokens: list[int] = []
    async for chunk in backend.generate(request):
        assert isinstance(chunk, Chunk)
        tokens += chunk.tokens
    return tokens


def _prompt(renderer: Renderer, *messages: Message) -> list[int]:
    return renderer.render_for_completion(list(messages))


def test_rules_match_latest_user_text_or_tool_output(renderer):
    backend = MockBackend(SCRIPT, renderer.encoding)
    assert isinstance(backend, Backend)
    ask = Message.of(Role.USER, "What's the Weather in Paris?")
    first = asyncio.run(_collect(backend, _request(_prompt(renderer, ask))))
    assert first[-1] == CALL
    parsed = parse_completion(first, encoding=renderer.encoding)
    assert not parsed.repairs
    call = parsed.messages[1]
    assert (call.channel, call.recipient, call.content_type) == (
        "commentary",
        "functions.get_weather",
        "<|constrain|>json",
    )
    assert json.loads(call.text) == {"city": "Paris"}

    tool = Message.of(
        Role.TOOL, '{"sky": "sunny"}', name="functions.get_weather", recipient="assistant", channel="commentary"
    )
    second = asyncio.run(_collect(backend, _request(_prompt(renderer, ask, *parsed.messages, tool))))
    parsed = parse_completion(second, encoding=renderer.encoding)
    assert second[-1] == RETURN and not parsed.repairs
    assert [(m.channel, m.text) for m in parsed.messages] == [
        ("analysis", "It is sunny."),
        ("final", "Sunny in Paris ☀️"),
    ]

    other = asyncio.run(_collect(backend, _request(_prompt(renderer, Message.of(Role.USER, "hi")))))
    assert [(m.channel, m.text) for m in parse_completion(other).messages] == [
        ("commentary", "Working on it."),
        ("final", "Hello!"),
    ]
    assert len(backend.prompts) == 3
    assert "What's the Weather in Paris?" in backend.prompt_text(0)
    assert backend.prompt_text().endswith("<|start|>user<|message|>hi<|end|><|start|>assistant")


def test_max_new_tokens_and_stop_ids_end_the_stream(renderer):
    backend = MockBackend(SCRIPT, renderer.encoding)
    prompt = _prompt(renderer, Message.of(Role.USER, "hi"))
    full = asyncio.run(_collect(backend, _request(prompt)))
    assert asyncio.run(_collect(backend, _request(prompt, max_new_tokens=5))) == full[:5]
    end_token = full.index(200007)  # <|end|> after the preamble
    assert asyncio.run(_collect(backend, _request(prompt, stops=[200007]))) == full[: end_token + 1]


def test_raw_steps_script_malformed_output(renderer):
    script = {"rules": [{"emit": [{"raw": "<|channel|>final<|message|>Hi<|end|><|return|>"}]}]}
    tokens = asyncio.run(_collect(MockBackend(script, renderer.encoding), _request(_prompt(renderer))))
    assert renderer.encoding.decode(tokens) == "<|channel|>final<|message|>Hi<|end|><|return|>"
    assert [r.kind.value for r in parse_completion(tokens).repairs] == ["stray_stop"]


def test_token_delay_and_cancellation(renderer):
    backend = MockBackend({**SCRIPT, "token_delay_ms": 20}, renderer.encoding)

    async def first_tokens() -> tuple[int, float]:
        stream = backend.generate(_request(_prompt(renderer, Message.of(Role.USER, "hi"))))
        start = time.perf_counter()
        got = [await anext(stream) for _ in range(3)]
        await stream.aclose()  # a cancelled generation produces nothing more
        return len(got), time.perf_counter() - start

    count, elapsed = asyncio.run(first_tokens())
    assert count == 3 and elapsed >= 0.055


def test_first_token_delay_waits_once_and_a_rule_overrides_it(renderer):
    rules = [{"match": {"user": "fast"}, "first_token_delay_ms": 0, "emit": [{"final": "quick"}]}, *SCRIPT["rules"]]
    backend = MockBackend({"rules": rules, "first_token_delay_ms": 150}, renderer.encoding)

    async def timed(text: str) -> tuple[float, float]:
        start = time.perf_counter()
        stream = backend.generate(_request(_prompt(renderer, Message.of(Role.USER, text))))
        await anext(stream)
        first = time.perf_counter() - start
        async for _ in stream:
            pass
        return first, time.perf_counter() - start

    first, whole = asyncio.run(timed("hi"))
    assert first >= 0.15 and whole - first < 0.1  # one wait, then the rest at once
    first, _ = asyncio.run(timed("fast"))
    assert first < 0.1


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({}, "'rules' list"),
        ({"rules": [], "first_token_delay_ms": "1"}, "first_token_delay_ms: must be a number"),
        ({"rules": [{"emit": [{"final": "x"}], "first_token_delay_ms": -2}]}, "rules[0].first_token_delay_ms"),
        ({"rules": [{"emit": []}]}, "rules[0].emit: must be a non-empty list of steps"),
        ({"rules": [{"match": {"user": "x"}}]}, "rules[0]: needs either 'emit'"),
        ({"rules": [{"alternatives": [[{"final": "x"}], []]}]}, "rules[0].alternatives[1]: must be a non-empty"),
        ({"rules": [{"emit": [{"final": "x"}], "token_delay_ms": True}]}, "rules[0].token_delay_ms"),
        ({"rules": [{"match": {"assistant": "x"}, "emit": [{"final": "x"}]}]}, "rules[0].match"),
        ({"rules": [{"match": {"user": "("}, "emit": [{"final": "x"}]}]}, "rules[0].match.user: invalid regex"),
        ({"rules": [{"emit": [{"final": "x"}, {"shout": "x"}]}]}, "rules[0].emit[1]"),
        ({"rules": [{"emit": [{"tool_call": {"arguments": {}}}]}]}, "tool_call: needs a 'name'"),
        ({"rules": [{"emit": [{"final": 3}]}]}, "rules[0].emit[0].final: must be a string"),
        ({"rules": [], "token_delay_ms": -1}, "token_delay_ms"),
    ],
)
def test_bad_scripts_are_rejected_with_the_place(script, message, encoding):
    with pytest.raises(ScriptError, match=re.escape(message)):
        MockBackend(script, encoding)


def test_alternatives_are_chosen_by_the_seed(encoding):
    options = [[{"final": f"answer {i}"}] for i in range(8)]
    backend = MockBackend({"rules": [{"alternatives": options}]}, encoding)

    def answer(seed):
        request = GenerateRequest(
            encoding.encode_marked("<|start|>user<|message|>q<|end|><|start|>assistant"),
            100,
            (RETURN,),
            "r",
            Sampling(seed=seed),
        )
        return encoding.decode(asyncio.run(_collect(backend, request)))

    assert answer(7) == answer(7) and answer(8) == answer(8)
    assert len({answer(seed) for seed in range(20)}) > 1


def test_no_matching_rule_is_a_clear_error(renderer, tmp_path):
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": [{"match": {"user": "only this"}, "emit": [{"final": "x"}]}]}))
    backend = MockBackend.from_file(path, renderer.encoding)
    with pytest.raises(ScriptError, match="no mock rule matches"):
        asyncio.run(_collect(backend, _request(_prompt(renderer, Message.of(Role.USER, "hi")))))
    with pytest.raises(ScriptError, match="cannot read mock script"):
        MockBackend.from_file(tmp_path / "missing.json")
