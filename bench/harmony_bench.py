"""Harmony render and streaming-parse speed: ours against openai-harmony, in the same run.

    python bench/harmony_bench.py [--repeats 7] [--write docs/benchmarks.md]

Render: a tool-calling conversation with 8 and with 50 tools to prompt tokens, cold (our caches cleared
before every render), warm (the same conversation rebuilt from fresh objects, as each request of a
serving tool loop arrives, with the caches kept), and with new instructions on every render beside
tools seen before.
Parse: 100,000 completion tokens fed one at a time to each streaming parser.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from reference import harmony_module, reference_encoding, to_reference  # noqa: E402
from report import markers, write_section  # noqa: E402

from harmony import (  # noqa: E402
    DeveloperContent,
    Message,
    ReasoningEffort,
    Renderer,
    Role,
    SystemContent,
    ToolDescription,
)
from harmony.parser import StreamParser  # noqa: E402

SECTION_START, SECTION_END = markers("harmony_bench")
PARSE_TOKENS = 100_000
FINAL_TEXT = "Your order has shipped — 到着予定は明日です. " * 5


def _tool(i: int) -> ToolDescription:
    """A tool as the gateway passes it: with its schema's JSON text, which the gateway makes once per
    request for the tenant's size caps and the schema check (that serialization is not timed here)."""
    return _with_schema_json(
        f"lookup_record_{i}",
        f"Looks up record set {i} in the customer database and returns matching rows.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Free-text query, e.g. a customer name or order number"},
                "limit": {"type": "integer", "description": "Maximum rows to return", "default": 10},
                "sort": {"type": "string", "enum": ["newest", "oldest", "relevance"], "default": "relevance"},
                "filters": {
                    "type": "object",
                    "description": "Optional column filters",
                    "properties": {
                        "status": {"type": "array", "items": {"type": "string", "enum": ["open", "closed"]}},
                        "since": {"type": "string", "description": "ISO date"},
                    },
                },
            },
            "required": ["query"],
        },
    )


def _with_schema_json(name: str, description: str, parameters: dict) -> ToolDescription:
    return ToolDescription(name, description, parameters, json.dumps(parameters, separators=(",", ":")))


INSTRUCTIONS = "You are a careful support agent. " * 8


def conversation(tools: int = 8, instructions: str = INSTRUCTIONS) -> list[Message]:
    messages = [
        Message.of(
            Role.SYSTEM, SystemContent(reasoning_effort=ReasoningEffort.HIGH, conversation_start_date="2026-11-21")
        ),
        Message.of(
            Role.DEVELOPER,
            DeveloperContent(instructions=instructions).with_function_tools([_tool(i) for i in range(tools)]),
        ),
    ]
    for turn in range(6):
        messages += [
            Message.of(
                Role.USER, f"Customer {turn} asks about order {1000 + turn}: where is it and when will it arrive? " * 3
            ),
            Message.of(
                Role.ASSISTANT, "The user wants the order status; I should look it up first. " * 4, channel="analysis"
            ),
            Message.of(
                Role.ASSISTANT,
                f'{{"query": "order {1000 + turn}", "limit": 3}}',
                channel="commentary",
                recipient="functions.lookup_record_1",
                content_type="<|constrain|>json",
            ),
            Message.of(
                Role.TOOL,
                f'{{"rows": [{{"order": {1000 + turn}, "status": "shipped", "eta": "2026-11-2{turn}"}}]}}',
                name="functions.lookup_record_1",
                recipient="assistant",
                channel="commentary",
            ),
            Message.of(
                Role.ASSISTANT, f"Order {1000 + turn} has shipped and should arrive soon. " * 3, channel="final"
            ),
        ]
    return messages


def completion_tokens(renderer: Renderer) -> list[int]:
    """A realistic completion stream: analysis, a tool call, a final answer, repeated."""
    from harmony.tokens import CHANNEL, CONSTRAIN, END, MESSAGE, START

    enc = renderer.encoding.encode_ordinary
    chunk = [
        CHANNEL, *enc("analysis"), MESSAGE, *enc("Let me think about the order status and the carrier. 💡 " * 6), END,
        START, *enc("assistant"), CHANNEL, *enc("commentary to=functions.lookup_record_1 "), CONSTRAIN, *enc("json"),
        MESSAGE, *enc('{"query": "order 1234", "limit": 3}'), END,
        START, *enc("assistant"), CHANNEL, *enc("final"), MESSAGE, *enc(FINAL_TEXT), END,
        START, *enc("assistant"),
    ]  # fmt: skip
    tokens: list[int] = []
    while len(tokens) < PARSE_TOKENS:
        tokens += chunk
    return tokens[:PARSE_TOKENS]


def best_of(repeats: int, fn, number: int) -> float:
    """Median seconds per call over `repeats` runs of `number` calls."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


TOOL_COUNTS = (8, 50)
RENDERS_PER_ROUND = 20


def render_times(repeats: int, tools: int) -> dict[str, float]:
    """Prompt length and seconds per render: openai-harmony, ours cold, ours warm (fresh objects)."""
    oh = harmony_module()
    ref = reference_encoding()
    renderer = Renderer()
    messages = conversation(tools)
    prompt = renderer.render_for_completion(messages, cot=_reference_policy())
    ref_conversation = oh.Conversation.from_messages([to_reference(m) for m in messages])
    assert prompt == ref.render_conversation_for_completion(ref_conversation, oh.Role.ASSISTANT), "renders differ"
    fresh = itertools.cycle([conversation(tools) for _ in range(25)])
    # each render new instructions with the tools seen before (apps that put the date or the user in them)
    renamed = iter([conversation(tools, f"Request {i}. {INSTRUCTIONS}") for i in range(repeats * RENDERS_PER_ROUND)])

    def ours_cold():
        renderer.clear_cache()
        renderer.render_for_completion(next(fresh), cot=_reference_policy())

    rounds = interleaved(
        repeats,
        {
            "ref": lambda: ref.render_conversation_for_completion(ref_conversation, oh.Role.ASSISTANT),
            "cold": ours_cold,
            "warm": lambda: renderer.render_for_completion(next(fresh), cot=_reference_policy()),
            "instructions": lambda: renderer.render_for_completion(next(renamed), cot=_reference_policy()),
        },
        RENDERS_PER_ROUND,
    )
    return {
        f"prompt_tokens_{tools}": len(prompt),
        f"render_ref_s_{tools}": statistics.median(rounds["ref"]),
        f"render_ours_cold_s_{tools}": statistics.median(rounds["cold"]),
        f"render_ours_warm_s_{tools}": statistics.median(rounds["warm"]),
        f"render_ours_instructions_s_{tools}": statistics.median(rounds["instructions"]),
        # the speed-ups: the median of each round's own ratio (both sides timed back to back in that round)
        f"speedup_cold_{tools}": statistics.median(r / c for r, c in zip(rounds["ref"], rounds["cold"], strict=True)),
        f"speedup_warm_{tools}": statistics.median(r / w for r, w in zip(rounds["ref"], rounds["warm"], strict=True)),
        f"speedup_instructions_{tools}": statistics.median(
            r / i for r, i in zip(rounds["ref"], rounds["instructions"], strict=True)
        ),
    }


def interleaved(repeats: int, fns: dict[str, Callable[[], object]], number: int) -> dict[str, list[float]]:
    """Seconds per call of each function, in rounds that time every function once in turn: a slow spell of
    the machine touches all sides of a round alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].append((time.perf_counter() - start) / number)
    return samples


def run(repeats: int) -> dict[str, float]:
    oh = harmony_module()
    ref = reference_encoding()
    renderer = Renderer()
    results: dict[str, float] = {}
    for tools in TOOL_COUNTS:
        results.update(render_times(repeats, tools))
    tokens = completion_tokens(renderer)

    def parse_ours():
        parser = StreamParser(renderer.encoding)
        feed = parser.feed
        for token in tokens:
            feed(token)
        parser.finish()

    def parse_ref():
        parser = oh.StreamableParser(ref, oh.Role.ASSISTANT)
        process = parser.process
        for token in tokens:
            process(token)

    def parse_ref_reading():
        parser = oh.StreamableParser(ref, oh.Role.ASSISTANT)
        for token in tokens:
            parser.process(token)
            _ = parser.last_content_delta, parser.current_channel, parser.current_recipient

    parse_repeats = max(3, repeats // 2)
    results["parse_ours_s"] = best_of(parse_repeats, parse_ours, 1)
    results["parse_ref_s"] = best_of(parse_repeats, parse_ref, 1)
    results["parse_ref_reading_s"] = best_of(parse_repeats, parse_ref_reading, 1)
    return results


def _reference_policy():
    from harmony import CotPolicy

    return CotPolicy.REFERENCE  # the same prompt as openai-harmony, so both do identical work


def render_rows(r: dict[str, float], us) -> list[str]:
    rows = []
    for tools in TOOL_COUNTS:
        ref = r[f"render_ref_s_{tools}"]
        head = f"| {tools} | {r[f'prompt_tokens_{tools}']:,} |"
        rows += [
            f"{head} openai-harmony `render_conversation_for_completion` | {us(ref)} | 1.0x |",
            f"{head} ours, cold (caches cleared each render) | {us(r[f'render_ours_cold_s_{tools}'])} | "
            f"{r[f'speedup_cold_{tools}']:.1f}x |",
            f"{head} ours, warm | {us(r[f'render_ours_warm_s_{tools}'])} | {r[f'speedup_warm_{tools}']:.1f}x |",
            f"{head} ours, new instructions each render, tools seen before | "
            f"{us(r[f'render_ours_instructions_s_{tools}'])} | {r[f'speedup_instructions_{tools}']:.1f}x |",
        ]
    return rows


def report(r: dict[str, float]) -> str:
    def us(seconds: float) -> str:
        return f"{seconds * 1e6:,.0f} µs"

    def rate(seconds: float) -> str:
        return f"{PARSE_TOKENS / seconds:,.0f} tok/s"

    oh_version = harmony_module().__dict__.get("__version__", "0.0.8")
    lines = [
        SECTION_START,
        "## Harmony render and parse (`bench/harmony_bench.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"openai-harmony {oh_version}. Both sides in the same process and run; medians. Renders are timed",
        f"in interleaved rounds (openai-harmony, ours cold, warm, new instructions; {RENDERS_PER_ROUND} renders each), "
        "and each speed-up is",
        "the median of the rounds' own ratios.",
        "",
        "Render a tool-calling conversation (identical tokens on both sides); warm renders get a freshly",
        "built copy of the conversation each time, as requests do:",
        "",
        "| tools | prompt tokens | renderer | time per render | speed-up vs openai-harmony |",
        "|---|---|---|---|---|",
        *render_rows(r, us),
        "",
        f"Stream-parse {PARSE_TOKENS:,} completion tokens one at a time (analysis, tool call, final, repeated):",
        "",
        "| parser | throughput | ratio (ours / theirs) |",
        "|---|---|---|",
        f"| ours `StreamParser.feed` (events returned) | {rate(r['parse_ours_s'])} | 1.0x |",
        f"| openai-harmony `StreamableParser.process` | {rate(r['parse_ref_s'])} | "
        f"{r['parse_ref_s'] / r['parse_ours_s']:.2f}x |",
        f"| openai-harmony, reading delta/channel/recipient per token | {rate(r['parse_ref_reading_s'])} | "
        f"{r['parse_ref_reading_s'] / r['parse_ours_s']:.2f}x |",
        "",
        "Targets: render at least 5x faster than openai-harmony (issue 2), and with 50 tools at least 5x",
        "cold and 20x warm (issue 23); streaming parse at least as fast as its StreamableParser (ratio ≥ 1.0).",
        SECTION_END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--write", type=Path, help="markdown file whose harmony section is replaced")
    args = parser.parse_args()
    section = report(run(args.repeats))
    print(section)
    if args.write:
        write_section(args.write, "harmony_bench", section)


if __name__ == "__main__":
    main()
