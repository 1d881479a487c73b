"""The engine against llama.cpp on the CPU, on one random checkpoint: gpt-oss-20b's width (hidden 2880, 32
experts top-4, vocabulary 201,088) at 6 layers and optionally 24, written in the Hugging Face layout and
converted to GGUF by llama.cpp's own converter (dense weights f16, and q8_0; the experts kept in MXFP4). Measured
alternately in one run, ROUNDS times, with the same thread count: engine variants (bf16 or int8 dense weights,
`dense_int8`; the MoE's decode in float or on int8 activations, `moe_activations` int8x2 or int8) and llama.cpp f16 and
q8_0 (as wide as the variants' dense weights); decode of 1 sequence and of 4 at
position 64, and a 512-token prefill; reported as medians of the ratios within a round (engine ÷ llama.cpp),
beside each side's median rate. llama.cpp's side is `llama-bench` (1 sequence, prefill) and
`llama-batched-bench` (4 sequences); the engine's is its paged runtime with DenseBF16, as serving runs it.
Also reported: the engine's decode bytes a second (dense weights, routed experts, KV) against the machine's
copy bandwidth measured in each round (the host's load drifts within a run).

llama.cpp, built from the source its Python binding ships on the package registry (no network at run time):

    pip download llama-cpp-python --no-binary :all: --no-deps -d /tmp/llama
    tar xzf /tmp/llama/llama_cpp_python-*.tar.gz -C /tmp/llama
    cd /tmp/llama/llama_cpp_python-*/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \\
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build build -j --target llama-bench llama-batched-bench
    python -m venv /tmp/llama-convert
    /tmp/llama-convert/bin/pip install torch==2.13.0 transformers -e gguf-py   # the converter's own needs

    python bench/llama_cpp_bench.py --llama-cpp /tmp/llama/llama_cpp_python-*/vendor/llama.cpp \\
        --convert-python /tmp/llama-convert/bin/python [--layers 6 24] [--threads 2] [--write docs/benchmarks.md]

The random checkpoint has no tokenizer; the GGUF gets a placeholder vocabulary of the same size (both sides
read token ids, never text); each sequence is fed its own random token each step, as `llama-batched-bench` feeds
its own. Each engine variant is made anew for each round (from its compiled graph: its files stay in the page
cache), as each llama.cpp measure is a process of its own. Where the checkpoint and the GGUFs fit in MemAvailable
together, the sides alternate measure by measure, ROUNDS rounds; where they do not (24 layers: a 13 GiB checkpoint
and a 13 GiB f16 GGUF on this project's 23 GiB), each round loads each side in its turn, pages it in and times it
(SEQUENTIAL_ROUNDS rounds); a shape of which one side alone exceeds MemAvailable is reported as not measured.
Without --llama-cpp, only the engine's figures and the bandwidth ratio are taken. A run prints its figures as
JSON; `--render RUN.json ... [--write docs/benchmarks.md]` makes the table of several runs (one per depth).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dense_bf16_bench import copy_bandwidth, prefill_rate, rates, step_bytes  # noqa: E402
from report import cpu_line, markers, write_section  # noqa: E402

from backends.engine.checkpoint import Checkpoint  # noqa: E402
from backends.engine.config import GPT_OSS_20B  # noqa: E402
from backends.engine.graph import GraphOptions  # noqa: E402
from backends.engine.kernels.build import KERNELS_ENV, build_library, kernel_choice  # noqa: E402
from backends.engine.kernels.variants import X86_VARIANTS  # noqa: E402
from backends.engine.make_checkpoint import write_random_checkpoint  # noqa: E402
from backends.engine.model_cache import compiled_model  # noqa: E402
from backends.engine.paged_runner import PagedRunner  # noqa: E402

NAME = "llama_cpp_bench"
ROUNDS = 5  # rounds of one run differed by up to 60% here (llama.cpp's 1-sequence decode: 15.1 to 24.6 tok/s)
DEPTH = 64  # decode position (as dense_bf16_bench's PROMPT)
DECODE_TOKENS = 32  # steps a decode measure times, on both sides
PREFILL = 512
MAX_POSITIONS = 1024
MEASURES = ("decode_1", "decode_4", "prefill")
COPY = "copy"  # a round's copy-bandwidth entry
COPY_MIB = 256  # MiB each thread copies (beside the loaded models)
SEQUENTIAL_ROUNDS = 3  # rounds of a shape whose sides are loaded in turn (each load reads the model from disk)
SEQUENTIAL_WARMUP = 4  # decode steps that page in an engine just loaded, before it is timed

CONVERT = """
import sys
llama, checkpoint, outfile, outtype = sys.argv[1:5]
sys.path.insert(0, llama)
sys.argv = ["convert_hf_to_gguf.py", checkpoint, "--outfile", outfile, "--outtype", outtype]
import convert_hf_to_gguf
from conversion.gpt_oss import GptOssModel

def placeholder_vocab(self):
    size = self.hparams["vocab_size"]
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("gpt-4o")
    self.gguf_writer.add_token_list([f"<t{n}>" for n in range(size)])
    self.gguf_writer.add_token_types([1] * size)
    self.gguf_writer.add_token_merges(["< t"])

GptOssModel.set_vocab = placeholder_vocab
convert_hf_to_gguf.main()
"""


def to_gguf(llama: Path, python: str, checkpoint: Path, out: Path, outtype: str) -> Path:
    subprocess.run([python, "-c", CONVERT, str(llama), str(checkpoint), str(out), outtype], check=True)
    return out


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def llama_rates(llama: Path, model: Path, threads: int) -> dict[str, float]:
    """llama.cpp's tokens a second for each measure (one run of each)."""
    bench = str(llama / "build" / "bin" / "llama-bench")
    common = ["-m", str(model), "-t", str(threads), "-r", "1", "-o", "jsonl"]
    decode = _json_lines(subprocess.run([bench, *common, "-p", "0", "-n", str(DECODE_TOKENS), "-d", str(DEPTH)],
                                        capture_output=True, text=True, check=True).stdout)  # fmt: skip
    prefill = _json_lines(subprocess.run([bench, *common, "-p", str(PREFILL), "-n", "0"],
                                         capture_output=True, text=True, check=True).stdout)  # fmt: skip
    batched = str(llama / "build" / "bin" / "llama-batched-bench")
    parallel = _json_lines(
        subprocess.run(
            [batched, "-m", str(model), "-t", str(threads), "-c", "2048", "-b", "512", "-ub", "512",
             "-npp", str(DEPTH), "-ntg", str(DECODE_TOKENS), "-npl", "4", "--output-format", "jsonl"],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    return {"decode_1": decode[0]["avg_ts"], "prefill": prefill[0]["avg_ts"], "decode_4": parallel[-1]["speed_tg"]}


def engine_rates(runtime: PagedRunner, rng: np.random.Generator) -> dict[str, float]:
    return {
        "decode_1": rates(runtime, 1, rng, DECODE_TOKENS),
        "decode_4": rates(runtime, 4, rng, DECODE_TOKENS),
        "prefill": prefill_rate(runtime, rng),
    }


@dataclasses.dataclass(frozen=True)
class Variant:
    """An engine configuration, and the llama.cpp GGUF whose dense weights are as wide."""

    dense_int8: bool
    int8_pieces: int  # the MoE decode path's activations: 0 float, 1 int8, 2 int8x2

    @property
    def base(self) -> str:
        """llama.cpp's outtype as wide as the dense weights."""
        return "q8_0" if self.dense_int8 else "f16"

    @property
    def dense_size(self) -> int:
        """Bytes a dense weight takes."""
        return 1 if self.dense_int8 else 2


# bytes a dense weight takes in each GGUF (q8_0: 32 int8 values and an f16 scale a block)
GGUF_DENSE_SIZE = {"f16": 2.0, "q8_0": 34 / 32}

VARIANTS = {
    "bf16": Variant(False, 0),  # the MoE's decode in float
    "bf16+act8x2": Variant(False, 2),  # on two int8 pieces of each activation: the CPU's default
    "bf16+act8": Variant(False, 1),  # the MoE's decode on int8 activations, as llama.cpp's is
    "int8": Variant(True, 0),
    "int8+act8": Variant(True, 1),
}


def measure(layers: int, threads: int, work: Path, llama: Path | None, python: str, names: list[str]) -> dict:
    config = dataclasses.replace(GPT_OSS_20B, num_hidden_layers=layers)
    directory = write_random_checkpoint(work / f"ckpt{layers}", config, layout="hf")
    choice = kernel_choice()
    kernels = None if choice is None else choice.path
    models, ggufs = {}, {}
    for name in names:
        variant = VARIANTS[name]
        options = GraphOptions(
            MAX_POSITIONS, dense_bf16=True, dense_int8=variant.dense_int8, moe_int8_pieces=variant.int8_pieces
        )
        models[name] = compiled_model(Checkpoint(directory), options, work / "graphs")
        if llama is not None and variant.base not in ggufs:
            ggufs[variant.base] = to_gguf(
                llama, python, directory, work / f"model{layers}-{variant.base}.gguf", variant.base
            )

    def engine(name: str) -> PagedRunner:
        return PagedRunner.create(str(models[name]), config, 4, MAX_POSITIONS, threads=threads, kernels=kernels)

    sizes, available = [_bytes(directory), *(path.stat().st_size for path in ggufs.values())], _available_memory()
    if max(sizes) > available:
        return {"layers": layers, "past_memory": max(sizes)}
    # each engine made anew for each of its measures, as each llama.cpp measure is a process of its own: two runtimes
    # of one build, made in one process and alternated, differed by up to 10% (a 4-sequence step of this shape on 2
    # AMD EPYC cores), so one runtime kept for every round would carry its own offset into every ratio; five
    # alternated rounds where both sides fit in memory together, else three (each load then reads its model from disk)
    together = sum(sizes) <= available
    rng = np.random.default_rng(0)
    for name in names:  # warm-up: the engine's files paged in, its graph's kernels made
        engine_rates(engine(name), rng)
    for gguf in ggufs.values():
        llama_rates(llama, gguf, threads)  # type: ignore[arg-type]
    rounds: list[dict] = []
    for round_index in range(ROUNDS if together else SEQUENTIAL_ROUNDS):
        taken: dict[str, dict[str, float]] = {}
        # each engine, each followed by its GGUF the first time the round meets it; the order turned by one each
        # round: the side measured first ran 5-12% slower than the same side measured second (alternated MoE
        # layers on 2 AMD EPYC cores, either side first), which a fixed order charges to one side every round
        turn = round_index % len(names)
        for name in names[turn:] + names[:turn]:
            runtime = engine(name)
            rates(runtime, 1, rng, SEQUENTIAL_WARMUP)  # its weights paged in
            taken[name] = engine_rates(runtime, rng)
            del runtime
            gc.collect()
            base = VARIANTS[name].base
            if base in ggufs and base not in taken:
                taken[base] = llama_rates(llama, ggufs[base], threads)  # type: ignore[arg-type]
        # the host's load drifts: each round's decode bytes/s are set against that round's copy bandwidth
        taken[COPY] = {"bandwidth": copy_bandwidth(threads, COPY_MIB)}
        rounds.append(taken)
    figures: dict = {"layers": layers, "rounds": rounds, "variants": names, "together": together}
    figures["engines_per_round"] = True  # each engine made anew each round
    figures["decode_tokens"] = "random"  # each sequence its own random token each step (dense_bf16_bench.rates)
    figures["kernels"] = "none" if choice is None else choice.variant
    figures["bandwidth"] = statistics.median(r[COPY]["bandwidth"] for r in rounds)
    for name in [*names, *ggufs]:
        for measure_name in MEASURES:
            figures[f"{name}_{measure_name}"] = statistics.median(r[name][measure_name] for r in rounds)
    for name in names:  # paired ratios: each engine against llama.cpp at its width and f16, in the same round
        for base in {VARIANTS[name].base, "f16"} & set(ggufs):
            for measure_name in MEASURES:
                figures[f"{name}/{base}_{measure_name}"] = statistics.median(
                    r[name][measure_name] / r[base][measure_name] for r in rounds
                )
        for batch in (1, 4):
            step = step_bytes(config, VARIANTS[name].dense_size, batch, DEPTH + DECODE_TOKENS // 2)
            figures[f"{name}_share_{batch}"] = statistics.median(
                r[name][f"decode_{batch}"] / batch * step / r[COPY]["bandwidth"] for r in rounds
            )
    for base in ggufs:  # llama.cpp's own distance from the bound, by the same count of bytes
        for batch in (1, 4):
            step = step_bytes(config, GGUF_DENSE_SIZE[base], batch, DEPTH + DECODE_TOKENS // 2)
            figures[f"{base}_share_{batch}"] = statistics.median(
                r[base][f"decode_{batch}"] / batch * step / r[COPY]["bandwidth"] for r in rounds
            )
    return figures


def _bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def _available_memory() -> int:
    """MemAvailable: what the page cache can hold of both models without evicting either."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[6])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-cpp", type=Path, help="a llama.cpp tree built as the docstring says")
    parser.add_argument("--convert-python", default=sys.executable, help="a Python with the converter's needs")
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=sorted(VARIANTS),
        default=["bf16+act8x2", "bf16", "bf16+act8"],
        help="engine variants, each loaded at once (the memory of several 6-layer engines and two GGUFs)",
    )
    parser.add_argument("--int8-max-layers", type=int, default=6, help="deeper shapes: 16-bit variants only (disk)")
    parser.add_argument(
        "--render", type=Path, nargs="+", help="measure nothing: the table of these runs' printed JSON (shapes)"
    )
    parser.add_argument(
        "--kernels",
        choices=[variant.name for variant in X86_VARIANTS],
        help="run the engine's kernels built for this CPU variant (e.g. x86-64-v3 on an AVX-512 machine) instead of"
        " the machine's own build; the docs' section is named after the variant that ran",
    )
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    if args.kernels:
        forced = next(variant for variant in X86_VARIANTS if variant.name == args.kernels)
        library = build_library(march=forced.march, cuda=False, extensions=forced.extensions)
        os.environ[KERNELS_ENV] = str(library)
    if args.render:
        runs = [json.loads(path.read_text()) for path in args.render]
        shapes = sorted((f for run in runs for f in run["shapes"]), key=lambda f: f["layers"])
        cpus = sorted({run.get("cpu", cpu_line()) for run in runs})
        _publish(report(shapes, args.threads, any("f16_decode_1" in f for f in shapes), "; ".join(cpus)), args.write)
        return
    shapes = []
    for layers in args.layers:
        names = [n for n in args.engines if layers <= args.int8_max_layers or VARIANTS[n].base == "f16"]
        with tempfile.TemporaryDirectory() as scratch:  # each shape's checkpoint, graphs and GGUFs, then gone
            shapes.append(measure(layers, args.threads, Path(scratch), args.llama_cpp, args.convert_python, names))
    print(json.dumps({"cpu": cpu_line(), "shapes": shapes}, indent=1))  # the CPU: bench/plots.py names it
    _publish(report(shapes, args.threads, args.llama_cpp is not None, cpu_line()), args.write)


def _publish(named: tuple[str, str], docs: Path | None) -> None:
    """Prints a report's section and, with `docs`, writes it there under its name."""
    name, section = named
    print(section)
    if docs:
        write_section(docs, name, section)


def _section_name(kernels: str, cpu: str) -> str:
    """One section per CPU maker and level the kernels ran at, both as the run recorded them (`kernels`: the shapes'
    kernel variant, `cpu`: cpu_line's words), so an AVX2 machine's run does not replace an AVX-512 one's nor an AMD
    machine's an Intel one's, and a level forced (`--kernels`) apart from a machine's own (`-native`). A run's printed
    JSON is committed as docs/llama_cpp_6{the same suffix}.json, which bench/plots.py draws."""
    native = kernels.startswith("native (") or kernels == "none"
    level = kernels.removeprefix("native (").removesuffix(" level)")
    if level.startswith("x86-64-v4"):
        return f"{NAME}_{_machine(cpu)}"
    return f"{NAME}_{level}{'-native' if native else ''}_{_machine(cpu)}"


def _family(cpu: str) -> re.Match | None:
    """The x86 family and model in cpu_line's words (runs before they were recorded name none)."""
    return re.search(r"family (\d+) model (\d+)", cpu)


def _machine(cpu: str) -> str:
    """The maker ("amd", "intel"; elsewhere the machine's architecture) and, where the run recorded them, the CPU's
    family and model ("amd-25-17"): one machine's run never replaces another's of the same maker."""
    maker = _cpu_name(cpu).split()[0].lower()
    found = _family(cpu)
    return f"{maker}-{found[1]}-{found[2]}" if found else maker


def _rate(figures: dict, measure_name: str, name: str) -> str:
    key = f"{name}_{measure_name}"
    return f"{figures[key]:.2f} tok/s" if key in figures else "not run"


def _ratio(figures: dict, key: str) -> str:
    return f"{figures[key]:.2f}x" if key in figures else ""


def _measured(shapes: list[dict]) -> list[dict]:
    """The shapes a run measured (not those past memory)."""
    return [f for f in shapes if f.get("rounds")]


def _all_recorded(shapes: list[dict], key: str, value: object) -> bool:
    """Whether every measured shape recorded `key` as `value` (runs before the key was recorded did not)."""
    measured = _measured(shapes)
    return bool(measured) and all(f.get(key) == value for f in measured)


def _order_note(shapes: list[dict]) -> str:
    """Whether the runs turned their sides' order each round: read from the rounds themselves (each round's sides
    are kept in the order they ran; runs before the turning began every round with the same side)."""
    measured = _measured(shapes)
    turned = bool(measured) and all(len({next(iter(r)) for r in f["rounds"]}) > 1 for f in measured)
    return " (the order turned by one each round)" if turned else ""


def _loading_note(shapes: list[dict]) -> str:
    """How the engines were held: made anew each round (runs that record it), or loaded once for every round."""
    if _all_recorded(shapes, "engines_per_round", True):
        return ", each engine made anew each round as each llama.cpp measure is a process of its own"
    return " with every side loaded"


def _tokens_note(shapes: list[dict]) -> str:
    """What the engine's decode steps were fed, where the runs record it."""
    if _all_recorded(shapes, "decode_tokens", "random"):
        return ", each sequence fed its own random token each step on both sides"
    return ""


def _sequential_note(shapes: list[dict]) -> str:
    """Which shapes were measured with each side loaded in its turn of a round."""
    apart = [str(f["layers"]) for f in shapes if f.get("together") is False]
    if not apart:
        return ""
    return (
        f" ({' and '.join(apart)} layers: the sides do not fit in memory together; {SEQUENTIAL_ROUNDS} rounds, each"
        " loading each side in its turn, paging it in and timing it)"
    )


def _cpu_name(cpu: str) -> str:
    """cpu_line's words without the extensions and trademark signs: "AMD EPYC", "Intel Xeon Processor"."""
    return cpu.split(" (")[0].replace("(R)", "").replace("(TM)", "")


def _family_words(cpu: str) -> str:
    found = _family(cpu)
    return f" (family {found[1]} model {found[2]})" if found else ""


def report(shapes: list[dict], threads: int, with_llama: bool, cpu: str) -> tuple[str, str]:
    """The section of these shapes' figures, measured on `cpu` (cpu_line's words): its name and its text."""
    kernels = ", ".join(sorted({f.get("kernels", "not recorded") for f in shapes}))
    section = _section_name(kernels, cpu)
    start, end = markers(section)
    labels = {"decode_1": "decode, 1 sequence", "decode_4": "decode, 4 sequences"}
    labels["prefill"] = f"prefill, {PREFILL} tokens"
    copies = ", ".join(f"{f['bandwidth'] / 1e9:.1f} GB/s" for f in shapes if "bandwidth" in f)
    lines = [
        start,
        f"## The engine against llama.cpp on {_cpu_name(cpu)}{_family_words(cpu)}, kernels {kernels}"
        " (`bench/llama_cpp_bench.py`)",
        "",
        f"CPU: {cpu}; the engine's kernels: {kernels}.",
        "",
        f"{os.cpu_count()} CPUs ({platform.machine()}), {threads} threads each, gpt-oss-20b's width with random"
        " weights: one checkpoint, converted to GGUF by llama.cpp's own converter (dense weights f16 or q8_0,",
        "experts MXFP4; llama.cpp's CPU path takes the experts' dot products on int8 activations). The engine reads"
        " the same checkpoint: its dense weights in bf16 (DenseBF16) or, `int8`, in int8 with a scale a row",
        "(`dense_int8`; the router stays bf16); its MXFP4 experts' decode path on int8 activations, `+act8x2` two"
        " int8 pieces of each (`moe_activations: int8x2`, what the default, `auto`, takes on the CPU), `+act8` one"
        " (`int8`), or in float (neither: `float`). Each engine against llama.cpp at its dense width and against f16.",
        f"Each shape's sides alternated in one run, {ROUNDS} rounds{_loading_note(shapes)}{_order_note(shapes)}"
        f"{_sequential_note(shapes)}; rates are medians, ratios medians of the ratios within a round."
        f" Decode at position {DEPTH}{_tokens_note(shapes)}. Bytes/s: a decode step's dense weights, routed experts"
        " and KV, over the",
        f"copy bandwidth measured in the same round ({threads} threads' NumPy copies, read + write; median of the"
        f" rounds: {copies}), the median"
        " of the rounds' ratios.",
        "",
    ]
    if not with_llama:
        lines += ["llama.cpp was not given to this run: the engine's figures only.", ""]
    lines += [
        "| layers | measure | engine | engine rate | llama.cpp at its width | engine ÷ that "
        "| **engine ÷ llama.cpp f16** | bytes/s ÷ copy bw | llama.cpp's bytes/s ÷ copy bw |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in shapes:
        if "past_memory" in f:
            held = f["past_memory"] / 2**30
            note = f"not measured: one side ({held:.0f} GiB) does not fit in memory"
            lines.append(f"| {f['layers']} | {note} | | | | | | | |")
            continue
        for m in MEASURES:
            for name in f["variants"]:
                base = VARIANTS[name].base
                share = base_share = ""
                if m.startswith("decode"):
                    batch = int(m[-1])
                    share = f"{f[f'{name}_share_{batch}']:.2f}"
                    base_share = f"{f[key]:.2f}" if (key := f"{base}_share_{batch}") in f else ""
                to_f16 = _ratio(f, f"{name}/f16_{m}")
                lines.append(
                    f"| {f['layers']} | {labels[m]} | {name} | {_rate(f, m, name)} | {base}: {_rate(f, m, base)} |"
                    f" {_ratio(f, f'{name}/{base}_{m}')} | {f'**{to_f16}**' if to_f16 else ''} | {share} |"
                    f" {base_share} |"
                )
    lines.append(end)
    return section, "\n".join(lines)


if __name__ == "__main__":
    main()
