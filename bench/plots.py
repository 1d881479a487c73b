"""The benchmarks' headline comparisons as pictures, drawn from the JSON the bench scripts wrote.

    python bench/plots.py [--write docs/images]

- `engine_vs_llama_cpp.svg`: the engine's decode (1 and 4 sequences) and prefill rates over llama.cpp f16's, per
  configuration of the engine, from `bench/llama_cpp_bench.py`'s runs (docs/llama_cpp_6_*.json: each machine's own
  kernels and the AVX2 ones forced);
- `engine_gpu_batch.svg`: the engine's decode tokens a second by batch on a GPU, from `bench/engine_check.py`
  (docs/engine_check.json);
- `gateway_vs_peers.svg`: short requests and streamed tokens per CPU second of the gateway, OpenAI's reference
  server and LiteLLM, and the latency the gateway and LiteLLM add in front of a slow backend, from
  `bench/gateway_bench.py --json` (docs/gateway_bench.json);
- `prefix_reuse_by_context.svg`: time to first token by context length with the engine's prefix reuse on and
  off, from `bench/prefix_cache_bench.py --json` (docs/prefix_cache_bench.json).

Each figure names the run it draws; a missing input skips its figure (and says so). SVG text, deterministic for a
given matplotlib: reviewable in a diff.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# AVX-512 machines' own kernels and the AVX2 ones forced there (an Intel Xeon, AMD EPYCs of the Zen 5 and Zen 4
# families), and an AVX2 machine's (an AMD EPYC without AVX-512): built for it, and the image's x86-64-v3 variant
LLAMA_RUNS = (
    DOCS / "llama_cpp_6_intel.json",
    DOCS / "llama_cpp_6_x86-64-v3_intel.json",
    DOCS / "llama_cpp_6_x86-64-v3-vnni_intel-6-167.json",
    DOCS / "llama_cpp_6_amd-26-2.json",
    DOCS / "llama_cpp_6_x86-64-v3_amd-26-2.json",
    DOCS / "llama_cpp_6_x86-64-v3-native_amd-25-1.json",
    DOCS / "llama_cpp_6_x86-64-v3_amd-25-1.json",
    DOCS / "llama_cpp_6_amd-25-17.json",
    DOCS / "llama_cpp_6_x86-64-v3_amd-25-17.json",
)
GPU_RUN = DOCS / "engine_check.json"
GATEWAY_RUN = DOCS / "gateway_bench.json"
PREFIX_RUN = DOCS / "prefix_cache_bench.json"
PEERS = (("reference", "OpenAI's reference server"), ("litellm", "LiteLLM"), ("gateway", "gpt-oss-gateway"))
PEER_COLOURS = {"reference": "tab:blue", "litellm": "tab:orange", "gateway": "tab:green"}
MEASURES = (("decode_1", "decode\n1 sequence"), ("decode_4", "decode\n4 sequences"), ("prefill", "prefill"))
ENGINES = (  # bf16 dense weights unless named
    ("bf16+act8x2", "defaults (moe_activations auto: int8x2)"),
    ("bf16", "moe_activations: float"),
    ("bf16+act8", "moe_activations: int8"),
    ("int8+act8", "+ dense_int8"),
)
GPU_BATCHES = (1, 8, 32, 64)
PANELS_A_ROW = 3  # runs side by side; more wrap to a new row
TITLE_WIDTH = 58  # characters of a panel title's line at its font size

plt.rcParams.update({"svg.hashsalt": "gpt-oss-gateway", "font.size": 9})


def _run(path: Path) -> dict | None:
    """A bench run's JSON, None where it was not written."""
    return json.loads(path.read_text()) if path.exists() else None


def _slots(groups: int, slot: int, slots: int, width: float) -> list[float]:
    """The x of bar `slot` of `slots` side by side in each of `groups` groups (groups at 0, 1, ...)."""
    return [group + (slot - (slots - 1) / 2) * width for group in range(groups)]


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, format="svg", metadata={"Date": None})
    plt.close(figure)
    return path


def llama_cpp_series(shape: dict) -> dict[str, list[float]]:
    """An engine configuration's label → its rate over llama.cpp f16's for each of MEASURES (the configurations a
    shape did not run left out)."""
    series = {
        label: [shape.get(f"{engine}/f16_{measure}", 0.0) for measure, _ in MEASURES] for engine, label in ENGINES
    }
    return {label: ratios for label, ratios in series.items() if any(ratios)}


def engine_vs_llama_cpp(runs: list[Path], output: Path) -> Path | None:
    """Grouped bars: each measure's rate over llama.cpp f16's (1.0, the line), per engine configuration and depth."""
    loaded = [run for run in map(_run, runs) if run is not None]
    shapes = [shape for run in loaded for shape in run["shapes"]]
    if not shapes:
        return None
    cpus = {run["cpu"] for run in loaded if "cpu" in run}  # runs before it was recorded name none
    where = f"{next(iter(cpus))}, 2 cores" if len(cpus) == 1 else "2 CPU cores"
    shape_cpus = [run.get("cpu", "") if len(cpus) > 1 else "" for run in loaded for _ in run["shapes"]]
    columns = min(len(shapes), PANELS_A_ROW)
    rows = -(-len(shapes) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.6 * rows), sharey=True, squeeze=False)
    axes = list(grid.flat)
    for unused in axes[len(shapes) :]:
        unused.set_visible(False)
    width = 0.8 / len(ENGINES)
    highest = max(ratio for shape in shapes for ratios in llama_cpp_series(shape).values() for ratio in ratios)
    for axis, shape, cpu in zip(axes, shapes, shape_cpus, strict=False):
        labels = [label for _, label in ENGINES]
        for label, ratios in llama_cpp_series(shape).items():  # each configuration in its own slot and colour
            index = labels.index(label)
            slots = _slots(len(MEASURES), index, len(ENGINES), width)
            axis.bar(slots, ratios, width, label=label, color=f"C{index}")
        axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axis.set_xticks(range(len(MEASURES)), [name for _, name in MEASURES])
        kernels = f", kernels {shape['kernels']}" if "kernels" in shape else ""
        title = f"{shape['layers']} layers at gpt-oss-20b's width{kernels}{f' on {cpu}' if cpu else ''}"
        axis.set_title(textwrap.fill(title, TITLE_WIDTH), fontsize=8)  # wrapped: a CPU's line is wider than its panel
        axis.set_ylim(0, highest * 1.35)  # room for the legend above the bars
    for row in grid:
        row[0].set_ylabel("tokens a second over llama.cpp f16's")
    shown = {label: handle for axis in axes for handle, label in zip(*axis.get_legend_handles_labels(), strict=True)}
    axes[0].legend(shown.values(), shown.keys(), loc="upper left", fontsize=7)
    figure.suptitle(f"The engine against llama.cpp on {where} (bench/llama_cpp_bench.py)", fontsize=8)
    return _save(figure, output / "engine_vs_llama_cpp.svg")


def engine_gpu_batch(run: Path, output: Path) -> Path | None:
    """Bars: decode tokens a second by batch, as engine_check measured them."""
    check = _run(run)
    if check is None:
        return None
    scale = check.get("scale", {})
    rates = [(batch, scale.get(f"decode_tok_s_batch_{batch}")) for batch in GPU_BATCHES]
    rates = [(batch, rate) for batch, rate in rates if rate]
    if not rates:
        return None
    figure, axis = plt.subplots(figsize=(5.6, 3.2))
    bars = axis.bar([str(batch) for batch, _ in rates], [rate for _, rate in rates], color="tab:green")
    axis.bar_label(bars, [f"{rate:,.0f}" for _, rate in rates], fontsize=8)
    axis.set_xlabel("sequences decoding at once")
    axis.set_ylabel("decode tokens a second")
    axis.set_title(f"gpt-oss-20b's shape, {check.get('device_name', 'a GPU')} (bench/engine_check.py)")
    return _save(figure, output / "engine_gpu_batch.svg")


def gateway_vs_peers(run: Path, output: Path) -> Path | None:
    """Left: short requests and SSE tokens per server CPU second, per server (log scale). Right: the latency added
    in front of a slow backend, p50 and p99, by the gateway and LiteLLM (each server on a core of its own)."""
    bench = _run(run)
    if bench is None:
        return None
    servers = [(side, label, bench["servers"][side]) for side, label in PEERS if side in bench["servers"]]
    figure, (rates, added) = plt.subplots(1, 2, figsize=(10, 3.6))
    measures = (("short_req_per_cpu_s", "short requests"), ("sse_tok_per_cpu_s", "streamed tokens"))
    width = 0.8 / len(servers)
    for index, (side, label, figures) in enumerate(servers):
        values = [figures[key] for key, _ in measures]
        positions = _slots(len(measures), index, len(servers), width)
        bars = rates.bar(positions, values, width, label=label, color=PEER_COLOURS[side])
        rates.bar_label(bars, [f"{figures[key]:,.0f}" for key, _ in measures], fontsize=7)
    rates.set_yscale("log")
    rates.set_xticks(range(len(measures)), [name for _, name in measures])
    rates.set_ylabel("per server CPU second")
    rates.set_title("with an instant backend", fontsize=8)
    rates.legend(loc="upper left", fontsize=8)
    rows = [row for row in bench["added"] if row["isolated"]]
    labels = [f"{row['clients']} clients\n{row['wait_ms']} ms backend" for row in rows]
    proxies = [(side, label) for side, label in PEERS[1:] if all(f"{side}_added_p99_ms" in row for row in rows)]
    width = 0.8 / (2 * len(proxies))
    for index, (side, label) in enumerate(proxies):
        for offset, quantile in enumerate(("p50", "p99")):
            positions = _slots(len(rows), 2 * index + offset, 2 * len(proxies), width)
            values = [max(row[f"{side}_added_{quantile}_ms"], 0.0) for row in rows]
            bars = added.bar(positions, values, width, label=f"{label}, {quantile}", color=PEER_COLOURS[side],
                             alpha=1.0 if offset else 0.5)  # fmt: skip
            added.bar_label(bars, [f"{value:,.1f}" for value in values], fontsize=6, rotation=90, padding=2)
    added.set_xticks(range(len(rows)), labels, fontsize=8)
    added.set_ylabel("latency added (ms)")
    added.set_title("in front of a slow backend, each server on a core of its own", fontsize=8)
    added.set_ylim(0, max(max(bar.get_height() for bar in added.patches), 1.0) * 1.3)
    added.legend(loc="upper left", fontsize=8)
    figure.suptitle(f"The gateway against its peers, {bench.get('cpu', 'a CPU')} (bench/gateway_bench.py)")
    return _save(figure, output / "gateway_vs_peers.svg")


def prefix_reuse_by_context(run: Path, output: Path) -> Path | None:
    """Lines: the gateway's time to first token by context length, prefix reuse off and on."""
    bench = _run(run)
    if bench is None:
        return None
    figure, axis = plt.subplots(figsize=(5.6, 3.4))
    for key, label in (("off", "reuse off"), ("on", "reuse on (default)")):
        turns = bench[key]
        axis.plot([t["context"] for t in turns], [t["ttft_s"] * 1e3 for t in turns], marker="o", markersize=3,
                  label=label)  # fmt: skip
    axis.set_yscale("log")
    axis.set_xlabel("context tokens (a tool loop's turns)")
    axis.set_ylabel("time to first token (ms)")
    axis.legend(fontsize=8)
    model = bench.get("model", {})
    axis.set_title(
        f"Prefix reuse, {model.get('layers', '?')} layers at hidden {model.get('hidden', '?')}, "
        f"{bench.get('cpu', 'a CPU')}",
        fontsize=8,
    )
    return _save(figure, output / "prefix_reuse_by_context.svg")


def render(output: Path) -> dict[str, Path | None]:
    output.mkdir(parents=True, exist_ok=True)
    return {
        "engine_vs_llama_cpp": engine_vs_llama_cpp(list(LLAMA_RUNS), output),
        "engine_gpu_batch": engine_gpu_batch(GPU_RUN, output),
        "gateway_vs_peers": gateway_vs_peers(GATEWAY_RUN, output),
        "prefix_reuse_by_context": prefix_reuse_by_context(PREFIX_RUN, output),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=DOCS / "images")
    args = parser.parse_args()
    for name, path in render(args.write).items():
        print(f"{name}: {path or 'skipped (no run to draw)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
