"""bench/plots.py draws the benchmarks' headline comparisons from the runs' JSON: each figure the docs show is drawn
from the committed runs, names what it compares, and a missing run skips its figure instead of failing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import plots  # noqa: E402


def test_every_figure_is_drawn_from_the_committed_runs_and_shown_in_the_docs(tmp_path):
    drawn = plots.render(tmp_path)
    assert all(drawn.values()), drawn
    shown = set(re.findall(r"\]\(images/([\w.]+\.svg)\)", (ROOT / "docs" / "benchmarks.md").read_text()))
    assert shown == {path.name for path in drawn.values()}
    for path in drawn.values():
        assert (ROOT / "docs" / "images" / path.name).is_file(), f"commit the drawn {path.name}"
    llama = drawn["engine_vs_llama_cpp"].read_text()
    assert "llama.cpp" in llama and "moe_activations: int8" in llama and "kernels x86-64-v3" in llama
    assert "NVIDIA H200" in drawn["engine_gpu_batch"].read_text()
    peers = drawn["gateway_vs_peers"].read_text()
    assert "LiteLLM" in peers and "reference server" in peers and "gpt-oss-gateway" in peers
    assert "reuse on" in drawn["prefix_reuse_by_context"].read_text()


def test_each_llama_cpp_run_is_named_after_the_cpu_it_ran_on():
    """The runs' files (and their docs sections) are named by bench/llama_cpp_bench.py's suffix, which holds the CPU's
    maker and, where the run recorded them, its family and model: an AMD machine's run never stands in the place of
    an Intel one's, nor one AMD machine's in another's."""
    import llama_cpp_bench  # the engine's modules: imported here, not for the plots' other tests

    makers = {"amd": "AMD", "intel": "Intel"}
    for path in plots.LLAMA_RUNS:
        run = json.loads(path.read_text())
        machine = path.stem.rsplit("_", 1)[1]  # the maker, and the family and model where the run recorded them
        assert run["cpu"].startswith(makers[machine.split("-")[0]]), (path.name, run["cpu"])
        assert ("family" in run["cpu"]) == ("-" in machine), (path.name, run["cpu"])
        section = "llama_cpp_bench" + path.name.removeprefix("llama_cpp_6").removesuffix(".json")
        assert f"<!-- {section}:start -->" in (ROOT / "docs" / "benchmarks.md").read_text(), section
        # the bench names a run's section from what the run recorded, whichever machine renders it
        kernels = ", ".join(sorted({shape["kernels"] for shape in run["shapes"]}))
        assert llama_cpp_bench._section_name(kernels, run["cpu"]) == section


def test_a_run_s_ratios_are_its_bars_and_its_cpu_is_named(tmp_path):
    shape = {"layers": 2, "bf16+act8x2/f16_decode_1": 1.0, "bf16+act8x2/f16_decode_4": 2.0,
             "bf16+act8x2/f16_prefill": 0.5, "int8+act8/f16_decode_1": 1.5, "int8+act8/q8_0_decode_1": 9.0}  # fmt: skip
    assert plots.llama_cpp_series(shape) == {  # float and one int8 piece did not run; against q8_0 is not drawn
        "defaults (moe_activations auto: int8x2)": [1.0, 2.0, 0.5],
        "+ dense_int8": [1.5, 0.0, 0.0],
    }
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"cpu": "Test CPU (avx2)", "shapes": [shape]}))
    svg = plots.engine_vs_llama_cpp([run], tmp_path).read_text()
    assert "Test CPU (avx2), 2 cores" in svg and "2 layers" in svg


def test_a_missing_run_skips_its_figure(tmp_path):
    assert plots.engine_vs_llama_cpp([tmp_path / "none.json"], tmp_path) is None
    assert plots.engine_gpu_batch(tmp_path / "none.json", tmp_path) is None
    assert plots.gateway_vs_peers(tmp_path / "none.json", tmp_path) is None
    assert plots.prefix_reuse_by_context(tmp_path / "none.json", tmp_path) is None


def test_the_peers_figure_draws_the_servers_a_run_measured(tmp_path):
    rates = {"short_req_s": 1, "short_req_per_cpu_s": 2, "short_p50_ms": 3, "short_p99_ms": 4, "sse_tok_s": 5,
             "sse_tok_per_cpu_s": 6}  # fmt: skip
    added = {"isolated": True, "clients": 10, "wait_ms": 250, "gateway_added_p50_ms": 0.5, "gateway_added_p99_ms": 1}
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"cpu": "Test CPU", "servers": {"reference": rates, "gateway": rates}, "added": [added]}))
    svg = plots.gateway_vs_peers(run, tmp_path).read_text()
    assert "Test CPU" in svg and "reference server" in svg and "LiteLLM" not in svg  # a run without LiteLLM


def test_a_run_s_section_says_its_sides_order_turned_only_where_its_rounds_show_it():
    """llama_cpp_bench turns its sides' order by one each round (the side measured first ran slower); a run's section
    says so only where the run's rounds began with different sides: runs from before kept one order throughout."""
    import llama_cpp_bench

    fixed = {"layers": 6, "rounds": [{"a": {}, "f16": {}, "b": {}}, {"a": {}, "f16": {}, "b": {}}]}
    turned = {"layers": 6, "rounds": [{"a": {}, "f16": {}, "b": {}}, {"b": {}, "f16": {}, "a": {}}]}
    assert llama_cpp_bench._order_note([fixed]) == ""
    assert llama_cpp_bench._order_note([turned]) == " (the order turned by one each round)"
    assert llama_cpp_bench._order_note([turned, fixed]) == ""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for path in plots.LLAMA_RUNS:
        run = json.loads(path.read_text())
        name = "llama_cpp_bench" + path.name.removeprefix("llama_cpp_6").removesuffix(".json")
        section = text[text.index(f"<!-- {name}:start -->") : text.index(f"<!-- {name}:end -->")]
        claims = "the order turned by one each round" in section
        assert claims == bool(llama_cpp_bench._order_note(run["shapes"])), path.name
