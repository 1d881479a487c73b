"""What an idle replica holds in memory, and where it goes: the gateway (mock backend) against the reference
server, then the gateway's process built up step by step.

    python bench/idle_memory.py [--reference-python /tmp/reference/bin/python] [--write docs/benchmarks.md]

Idle: started, one short request answered, then left alone for a second. Resident memory is read from
/proc (RssAnon: what the process allocated itself; RssFile: mapped files such as shared libraries). The
build-up runs each step in one fresh interpreter and records the growth of each kind.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from gateway_bench import SHORT, start_gateway, start_reference  # noqa: E402
from report import markers, write_section  # noqa: E402

from harmony import load_harmony_encoding  # noqa: E402

SECTION = "idle-memory"
MIB = 1024 * 1024

# Run in a fresh interpreter: each step's code, then its memory. The tokenizer is built as
# harmony.encoding does it, in parts, so that each part's share shows.
BUILD_UP = r"""
import json, sys
def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile")}
steps = [("Python interpreter", rss())]
import importlib
for label, modules in [
    ("numpy", ["numpy"]),
    ("aiohttp", ["aiohttp"]),
    ("redis (asyncio client)", ["redis.asyncio"]),
    ("pydantic and pydantic-settings", ["pydantic", "pydantic_settings"]),
    ("structlog (it imports rich)", ["structlog"]),
    ("the gateway's own modules and the rest they import", ["gateway.app", "gateway.cli", "backends.mock"]),
]:
    for module in modules:
        importlib.import_module(module)
    steps.append((f"import: {label}", rss()))
from harmony.vocab import load_vocabulary_bytes, parse_ranks
ranks = parse_ranks(load_vocabulary_bytes(None))
steps.append(("tokenizer: o200k ranks as a Python dict (200k bytes keys, int values)", rss()))
import tiktoken
from harmony.encoding import O200K_PATTERN
from harmony.tokens import SPECIAL_TOKENS
core = tiktoken.Encoding("o200k", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens=SPECIAL_TOKENS)
steps.append(("tokenizer: tiktoken's BPE core (its own copy of the ranks, both ways)", rss()))
table = [b""] * (max(ranks.values()) + 1)
for token_bytes, rank in ranks.items():
    table[rank] = token_bytes
steps.append(("tokenizer: the id -> bytes table for decoding (shares the dict's bytes)", rss()))
json.dump(steps, sys.stdout)
"""


def status(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "RssAnon", "RssFile")}


def idle(server) -> dict[str, int]:
    time.sleep(1.0)
    return status(server.pid)


def build_up() -> list[tuple[str, dict[str, int]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", BUILD_UP], env=env, capture_output=True, text=True, check=True)
    return [(name, memory) for name, memory in json.loads(out.stdout)]


def run(args: argparse.Namespace) -> dict:
    marked = SHORT
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="idle-memory-") as tmp:
        scratch = Path(tmp)
        gateway = start_gateway(marked, scratch)
        try:
            figures["gateway"] = idle(gateway)
        finally:
            gateway.stop()
        if args.reference_python:
            reference = start_reference(args.reference_python, load_harmony_encoding().encode_marked(marked), scratch)
            try:
                figures["reference"] = idle(reference)
            finally:
                reference.stop()
    figures["build_up"] = build_up()
    return figures


def report(figures: dict) -> str:
    def mib(value: int) -> str:
        return f"{value / MIB:,.0f}"

    start, end = markers(SECTION)
    lines = [
        start,
        "## Idle memory of a replica (`bench/idle_memory.py`)",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}. Each server started, one short "
        "request answered, then left alone for a second; resident memory from /proc (anonymous: allocated by "
        "the process; file: mapped files such as shared libraries), MiB.",
        "",
        "| server | resident | anonymous | file |",
        "|---|---|---|---|",
    ]
    names = {"gateway": "gpt-oss-gateway, mock backend", "reference": "reference (gpt-oss), its test backend"}
    for key, name in names.items():
        if key in figures:
            memory = figures[key]
            lines.append(f"| {name} | {mib(memory['VmRSS'])} | {mib(memory['RssAnon'])} | {mib(memory['RssFile'])} |")
    lines += [
        "",
        "Where the gateway's goes, built up step by step in one fresh interpreter (growth at each step, MiB):",
        "",
        "| step | anonymous | file |",
        "|---|---|---|",
    ]
    previous = None
    for name, memory in figures["build_up"]:
        if previous is None:
            lines.append(f"| {name} | {mib(memory['RssAnon'])} (total) | {mib(memory['RssFile'])} (total) |")
        else:
            grown = {key: memory[key] - previous[key] for key in memory}
            lines.append(f"| {name} | +{mib(grown['RssAnon'])} | +{mib(grown['RssFile'])} |")
        previous = memory
    steps = figures["build_up"]
    tokenizer = steps[-1][1]["RssAnon"] - steps[-4][1]["RssAnon"]
    lines += [
        "",
        f"The tokenizer holds {mib(tokenizer)} MiB of the anonymous memory: the rank dict stays alive because "
        "tiktoken's Encoding keeps it (for pickling only), beside the Rust core's own tables.",
        end,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-python", help="a Python with gpt-oss installed, for the reference server")
    parser.add_argument("--write", type=Path, help="markdown file whose idle-memory section is replaced")
    args = parser.parse_args()
    section = report(run(args))
    print(section)
    if args.write:
        write_section(args.write, SECTION, section)


if __name__ == "__main__":
    main()
