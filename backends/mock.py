"""A scripted backend for users' CI and our tests: it emits Harmony output token by token.

A script is JSON: `{"rules": [...], "token_delay_ms": 0}`. Each rule has an optional `match`
(`{"user": REGEX}` or `{"tool": REGEX}`, searched in the latest user message or tool output of
the prompt, or `{"prompt": REGEX}`, searched in the whole prompt as text; a rule without `match`
always applies) and `emit`, a list of steps:
`{"analysis": TEXT}`, `{"commentary": TEXT}` (a preamble), `{"final": TEXT}`,
`{"tool_call": {"name": NAME, "arguments": OBJECT_OR_STRING}}` (with `"namespace": NS` a call to
`NS.NAME` instead of `functions.NAME`; with `"input": TEXT` instead of arguments a freeform call, its
raw text without `<|constrain|>json`), or `{"raw": TEXT}` where
`<|name|>` marks stand for special tokens (to script malformed output). A rule's own
`token_delay_ms` overrides the script's; so does its `first_token_delay_ms`, a wait before the first
token (as a prefill takes), which the script can also set for every rule. Instead of `emit`, a rule
may give `alternatives`, a list of step lists: one is emitted, chosen by the request's seed (at
random without one), so that `n` and `seed` behave as with a sampling model. The first matching rule
wins. The backend records the prompts it receives and the tokens it emits for each (most recent last).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harmony import HarmonyEncoding, Role, load_harmony_encoding, parse_completion
from harmony.tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START

from .base import Capabilities, Chunk, GenerateRequest

RECORDED_PROMPTS = 64
_STEP_KINDS = ("analysis", "commentary", "final", "tool_call", "raw")
_SOURCES = ("user", "tool", "prompt")
_UNSEEDED = random.SystemRandom()
_DELAY_KEYS = ("token_delay_ms", "first_token_delay_ms")


class ScriptError(ValueError):
    """The mock script is malformed; the message says where."""


@dataclass(frozen=True, slots=True)
class _Rule:
    source: str | None  # one of _SOURCES; None matches anything
    pattern: re.Pattern[str] | None
    alternatives: tuple[tuple[dict[str, Any], ...], ...]  # one is emitted: chosen by the seed, else at random
    delay_s: float | None
    first_delay_s: float | None


def _delay_s(value: Any, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ScriptError(f"{where}: must be a number >= 0")
    return value / 1000


def _parse_steps(steps: Any, where: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(steps, list) or not steps:
        raise ScriptError(f"{where}: must be a non-empty list of steps")
    for step_index, step in enumerate(steps):
        if not isinstance(step, dict) or len(step) != 1 or next(iter(step)) not in _STEP_KINDS:
            raise ScriptError(f"{where}[{step_index}]: one of {', '.join(_STEP_KINDS)}")
        kind, value = next(iter(step.items()))
        if kind == "tool_call":
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                raise ScriptError(f"{where}[{step_index}].tool_call: needs a 'name'")
            if not isinstance(value.get("namespace", ""), str) or not isinstance(value.get("input", ""), str):
                raise ScriptError(f"{where}[{step_index}].tool_call: 'namespace' and 'input' are strings")
        elif not isinstance(value, str):
            raise ScriptError(f"{where}[{step_index}].{kind}: must be a string")
    return tuple(steps)


def _parse_rule(index: int, raw: Any) -> _Rule:
    where = f"rules[{index}]"
    if not isinstance(raw, dict) or ("emit" in raw) == ("alternatives" in raw):
        raise ScriptError(f"{where}: needs either 'emit' (a list of steps) or 'alternatives' (a list of such lists)")
    if "emit" in raw:
        alternatives: tuple[tuple[dict[str, Any], ...], ...] = (_parse_steps(raw["emit"], f"{where}.emit"),)
    else:
        options = raw["alternatives"]
        if not isinstance(options, list) or not options:
            raise ScriptError(f"{where}.alternatives: must be a non-empty list of step lists")
        alternatives = tuple(_parse_steps(o, f"{where}.alternatives[{i}]") for i, o in enumerate(options))
    source = pattern = None
    match = raw.get("match")
    if match is not None:
        if not isinstance(match, dict) or len(match) != 1 or next(iter(match)) not in _SOURCES:
            raise ScriptError(f"{where}.match: must be {{SOURCE: REGEX}} with SOURCE one of {', '.join(_SOURCES)}")
        source, regex = next(iter(match.items()))
        try:
            pattern = re.compile(regex)
        except (re.error, TypeError) as exc:
            raise ScriptError(f"{where}.match.{source}: invalid regex ({exc})") from exc
    delays = [None if raw.get(k) is None else _delay_s(raw[k], f"{where}.{k}") for k in _DELAY_KEYS]
    return _Rule(source, pattern, alternatives, *delays)


class MockBackend:
    """Scripted Harmony output; see the module docstring for the script format."""

    def __init__(self, script: dict[str, Any], encoding: HarmonyEncoding | None = None) -> None:
        if not isinstance(script, dict) or not isinstance(script.get("rules"), list):
            raise ScriptError("a mock script is an object with a 'rules' list")
        self._rules = [_parse_rule(i, rule) for i, rule in enumerate(script["rules"])]
        self._matches_prompt = any(rule.source == "prompt" for rule in self._rules)
        self._delay_s, self._first_delay_s = (_delay_s(script.get(k, 0), k) for k in _DELAY_KEYS)
        self._encoding = encoding or load_harmony_encoding()
        # each rule's alternatives as tokens, encoded once
        self._completions = [[self._completion(steps) for steps in rule.alternatives] for rule in self._rules]
        # "service_tiers": true in the script: it says it schedules by tier (and records each request's)
        self.capabilities = Capabilities(context_length=131_072, service_tiers=script.get("service_tiers") is True)
        self.tiers: deque[str] = deque(maxlen=RECORDED_PROMPTS)
        self.prompts: deque[list[int]] = deque(maxlen=RECORDED_PROMPTS)
        self.outputs: deque[list[int]] = deque(maxlen=RECORDED_PROMPTS)  # what each recorded prompt got
        self.active = 0  # generations in flight (tests check that cancellation reaches the backend)

    @classmethod
    def from_file(cls, path: str | Path, encoding: HarmonyEncoding | None = None) -> MockBackend:
        try:
            script = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ScriptError(f"cannot read mock script {path}: {exc}") from exc
        return cls(script, encoding)

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None

    def prompt_text(self, index: int = -1) -> str:
        """A recorded prompt as text (for assertions in tests)."""
        return self._encoding.decode(self.prompts[index])

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        self.tiers.append(request.tier)
        self.prompts.append(list(request.prompt))
        emitted: list[int] = []
        self.outputs.append(emitted)
        index = self._rule_for(request.prompt)
        rule, completions = self._rules[index], self._completions[index]
        seed = request.sampling.seed
        chooser = random.Random(seed) if seed is not None else _UNSEEDED
        tokens = completions[chooser.randrange(len(completions))] if len(completions) > 1 else completions[0]
        delay_s = self._delay_s if rule.delay_s is None else rule.delay_s
        first_delay_s = self._first_delay_s if rule.first_delay_s is None else rule.first_delay_s
        stops = set(request.stop_ids)
        self.active += 1
        try:
            if first_delay_s:
                await asyncio.sleep(first_delay_s)
            for token in tokens[: request.max_new_tokens]:
                if delay_s:
                    await asyncio.sleep(delay_s)
                emitted.append(token)
                yield Chunk([token])
                if token in stops:
                    return
        finally:
            self.active -= 1

    def _rule_for(self, prompt: list[int]) -> int:
        """The index of the first rule that matches; the prompt is parsed only when a rule looks at it."""
        latest: dict[str, str] | None = None
        for index, rule in enumerate(self._rules):
            if rule.source is None:
                return index
            if latest is None:
                latest = self._latest(prompt)
            text = latest.get(rule.source)
            if text is not None and rule.pattern is not None and rule.pattern.search(text):
                return index
        raise ScriptError("no mock rule matches the prompt; add a rule without 'match' as a fallback")

    def _latest(self, prompt: list[int]) -> dict[str, str]:
        """The latest user message or tool output of the prompt, and with a `prompt` rule the whole text."""
        latest: dict[str, str] = {}
        for message in parse_completion(prompt, role=None, encoding=self._encoding).messages:
            if message.role is Role.USER:
                latest = {"user": message.text}
            elif message.role is Role.TOOL:
                latest = {"tool": message.text}
        if self._matches_prompt:
            latest["prompt"] = self._encoding.decode(prompt)
        return latest

    def _completion(self, steps: tuple[dict[str, Any], ...]) -> list[int]:
        encode = self._encoding.encode_ordinary
        out: list[int] = []
        for index, step in enumerate(steps):
            kind, value = next(iter(step.items()))
            if kind == "raw":
                out += self._encoding.encode_marked(value)
                continue
            if index:
                out += [START, *encode("assistant")]
            if kind == "tool_call":
                recipient = f"{value.get('namespace', 'functions')}.{value['name']}"
                if "input" in value:
                    out += [CHANNEL, *encode(f"commentary to={recipient}"), MESSAGE, *encode(value["input"]), CALL]
                    continue
                arguments = value.get("arguments", {})
                body = arguments if isinstance(arguments, str) else json.dumps(arguments)
                out += [CHANNEL, *encode(f"commentary to={recipient} "), CONSTRAIN, *encode("json")]
                out += [MESSAGE, *encode(body), CALL]
            else:
                stop = RETURN if kind == "final" else END
                out += [CHANNEL, *encode(kind), MESSAGE, *encode(value), stop]
        return out


def from_options(options: dict[str, Any], encoding: HarmonyEncoding) -> MockBackend:
    """The registry's factory: `{"script": PATH}` or an inline script (`{"rules": [...], ...}`)."""
    if "script" in options:
        return MockBackend.from_file(options["script"], encoding)
    return MockBackend(options, encoding)
