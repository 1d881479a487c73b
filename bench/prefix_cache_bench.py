"""Prefix reuse in the built-in engine: a tool loop over a growing context, through the gateway's Responses API,
with the engine's prefix cache on and off in one run.

    python bench/prefix_cache_bench.py [--turns 20] [--start 2000] [--end 8000] [--write docs/benchmarks.md]
        [--json docs/prefix_cache_bench.json]

A random-weight gpt-oss (8 layers, hidden 512, the real vocabulary) on the CPU. Turn 1 asks with a `start`-token
message; every later turn continues by `previous_response_id` with a tool output sized so that the context
reaches `end` tokens at the last turn (the model is forced to call the tool each turn). Per turn: time to first
token as the gateway measures it (`gateway_time_to_first_token_seconds`: admission to the first generated
token), the client's time to the first output event, and `usage.input_tokens_details.cached_tokens`. `--json`
keeps the turns for bench/plots.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

import onnxruntime
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from gateway_fixtures import gateway_settings  # noqa: E402
from live_gateway import LiveGateway  # noqa: E402
from report import cpu_line, markers, write_section  # noqa: E402

from backends.engine.config import ModelConfig  # noqa: E402
from backends.engine.make_checkpoint import write_random_checkpoint  # noqa: E402
from harmony import load_harmony_encoding  # noqa: E402

NAME = "prefix_cache_bench"
MODEL = "gpt-oss-20b"
CONFIG = ModelConfig(
    num_hidden_layers=8,
    num_experts=16,
    experts_per_token=4,
    hidden_size=512,
    intermediate_size=512,
    head_dim=64,
    num_attention_heads=8,
    num_key_value_heads=2,
)
UNIT = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": UNIT}]
OUTPUT_EVENTS = ("response.output_item.added", "response.output_text.delta", "response.reasoning_text.delta")


@dataclass
class Turn:
    context: int  # input tokens
    output: int  # output tokens
    cached: int
    ttft_s: float  # the gateway's: admission to the first generated token
    first_event_s: float  # the client's: request sent to the first output event


def _text(tokens: int, tag: str) -> str:
    """Report lines of about `tokens` tokens."""
    encoding = load_harmony_encoding()
    lines, size, n = [], 0, 0
    while size < tokens:
        line = f"{tag} record {n}: station {n * 7 % 101} reports {n * 13 % 37} mm of rain and wind {n % 9} m/s.\n"
        lines.append(line)
        size += len(encoding.encode_ordinary(line))
        n += 1
    return "".join(lines)


def _ttft_sum(live: LiveGateway) -> float:
    sample = live.services.metrics.registry.get_sample_value(
        "gateway_time_to_first_token_seconds_sum", {"model": MODEL}
    )
    return sample or 0.0


def _loop(checkpoint: Path, workdir: Path, reuse: bool, args: argparse.Namespace) -> list[Turn]:
    turns, start, end = args.turns, args.start, args.end
    options = {
        "threads": args.threads,
        "checkpoint": str(checkpoint),
        "cache_dir": str(workdir / "graphs"),
        "max_positions": end + 1024,
        "max_batch": 2,
        "prefix_cache_tokens": None if reuse else 0,
    }
    engine = {"kind": "onnx", "options": options, "models": [MODEL]}
    live = LiveGateway(gateway_settings(workdir, backends={"engine": engine})).start()
    try:
        while not live.call(live.services.backends[MODEL].ready()):
            time.sleep(0.1)
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=600)
        ask = {"model": MODEL, "tools": TOOLS, "tool_choice": "required", "max_output_tokens": 64, "temperature": 0}
        client.responses.create(input="Warm up.", **ask)  # loads the session's kernels
        growth = (end - start) // max(1, turns - 1)
        results: list[Turn] = []
        previous, next_input = None, [{"role": "user", "content": _text(start, "Station")}]
        for turn in range(turns):
            before, sent = _ttft_sum(live), time.monotonic()
            first_event, response = None, None
            extra = {"previous_response_id": previous} if previous else {}
            for event in client.responses.create(input=next_input, stream=True, **ask, **extra):
                if first_event is None and event.type in OUTPUT_EVENTS:
                    first_event = time.monotonic() - sent
                if event.type in ("response.completed", "response.incomplete"):
                    response = event.response
            assert response is not None and response.usage is not None
            cached = response.usage.input_tokens_details.cached_tokens
            usage = response.usage
            results.append(
                Turn(usage.input_tokens, usage.output_tokens, cached, _ttft_sum(live) - before, first_event or 0.0)
            )
            previous = response.id
            report = _text(max(32, growth - usage.output_tokens - 16), f"Turn {turn}")  # 16: the output's framing
            calls = [item for item in response.output if item.type == "function_call"]
            if calls:
                next_input = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": report}]
            else:  # the answer ran out of tokens before a call: the loop goes on with a user message
                next_input = [{"role": "user", "content": report}]
        return results
    finally:
        live.stop()


def _section(off: list[Turn], on: list[Turn], threads: int) -> str:
    start, end = markers(NAME)
    rows = []
    for number, (cold, warm) in enumerate(zip(off, on, strict=True), start=1):
        earlier = on[number - 2] if number > 1 else None
        computed = f"{warm.cached / (earlier.context + earlier.output):.0%}" if earlier else "–"
        rows.append(
            f"| {number} | {warm.context:,} | {cold.ttft_s * 1000:,.0f} | {warm.ttft_s * 1000:,.0f} | "
            f"{cold.ttft_s / warm.ttft_s:.1f}x | {cold.first_event_s * 1000:,.0f} | {warm.first_event_s * 1000:,.0f} | "
            f"{warm.cached:,} ({warm.cached / warm.context:.0%}) | {computed} |"
        )
    later = list(zip(off[1:], on[1:], strict=True))
    near_4k = min(later, key=lambda pair: abs(pair[1].context - 4000))
    speedups = [cold.ttft_s / warm.ttft_s for cold, warm in later]
    least_cached = min(warm.cached / warm.context for _, warm in later)
    least_kept = min(warm.cached / (last.context + last.output) for last, warm in pairwise(on))
    return "\n".join(
        [
            start,
            "## Prefix reuse in the engine (`bench/prefix_cache_bench.py`)",
            "",
            f"CPU: {cpu_line()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, onnxruntime "
            f"{onnxruntime.__version__}, intra-op threads {threads or 'one per core'}. fp32 on the CPU.",
            f"Model (random weights): {CONFIG.num_hidden_layers} layers, {CONFIG.num_experts} MXFP4 experts top-"
            f"{CONFIG.experts_per_token}, hidden {CONFIG.hidden_size}, vocabulary 201,088. A {len(on)}-turn tool loop "
            "through the Responses API (`previous_response_id`, a function call forced each turn, a tool output "
            "added each turn), the same loop with `prefix_cache_tokens: 0` first, in one run.",
            "",
            "| turn | context tokens | TTFT, reuse off (ms) | TTFT, reuse on (ms) | speed-up | first event, off (ms) "
            "| first event, on (ms) | cached tokens (of the prompt) | of what the last turn computed |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"From turn 2 on: time to first token {min(speedups):.1f}x to {max(speedups):.1f}x lower with reuse "
            f"(median {statistics.median(speedups):.1f}x); {near_4k[0].ttft_s / near_4k[1].ttft_s:.1f}x at "
            f"{near_4k[1].context:,} tokens of context; `cached_tokens` at least {least_cached:.0%} of the prompt "
            f"(the rest is the new tool output) and at least {least_kept:.0%} of the tokens the turn before "
            "computed (its prompt and output). "
            "TTFT is the gateway's histogram (admission to the first generated token); the first event is what "
            "the client sees, a few decode steps later (the call's header). Each turn prefills the tool output it "
            "adds and, with random weights, most of the previous answer: its text re-renders into other tokens "
            "than the model sampled (docs/backends.md, *Prefix reuse*).",
            end,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--start", type=int, default=2000, help="tokens of the first turn's message")
    parser.add_argument("--end", type=int, default=8000, help="tokens of context at the last turn")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: one per core)")
    parser.add_argument("--write", type=Path, help="write the section into this markdown file")
    parser.add_argument("--json", type=Path, help="write the turns here, for bench/plots.py")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prefix-bench-") as directory:
        workdir = Path(directory)
        checkpoint = write_random_checkpoint(workdir / "model", CONFIG, "original", seed=3)
        off = _loop(checkpoint, workdir, False, args)
        on = _loop(checkpoint, workdir, True, args)
    section = _section(off, on, args.threads)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)
    if args.json:
        run = {"cpu": cpu_line(), "model": {"layers": CONFIG.num_hidden_layers, "hidden": CONFIG.hidden_size},
               "off": [asdict(turn) for turn in off], "on": [asdict(turn) for turn in on]}  # fmt: skip
        args.json.write_text(json.dumps(run, indent=1) + "\n")


if __name__ == "__main__":
    main()
