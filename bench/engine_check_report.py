"""The docs section of bench/engine_check.py: parity, kernel and 20b-shape figures as markdown, from one run's
(or several merged runs') results."""

from __future__ import annotations

from typing import Any

SECTION = "engine_check"
GEMM_ENV = "GATEWAY_MOE_GEMM_MIN_TOKENS"  # read when a session makes its kernel
MMA_ENV = "GATEWAY_MOE_MMA_MIN_TOKENS"
PREFETCH_ENV = "GATEWAY_MOE_L2_PREFETCH"


def markdown(results: dict[str, Any]) -> str:
    """The docs section: parity, kernel, and the 20b-shape figures, from one run's (or merged) results."""
    start, end = f"<!-- {SECTION}:start -->", f"<!-- {SECTION}:end -->"
    bandwidth = results.get("copy_bandwidth_bytes_s")
    lines = [
        start,
        "## The engine on a GPU (`bench/engine_check.py`)",
        "",
        f"Device: {results.get('device_name', '?')}, onnxruntime-gpu {results.get('onnxruntime')}; measured "
        f"device-to-device copy {bandwidth / 1e12:.2f} TB/s (read + written)."
        if bandwidth
        else "",
        "",
        *(f"- Run: {run}." for run in results.get("runs", [])),
        "",
    ]
    parity = results.get("parity", {})
    if "logit_scale" in parity:
        lines += [
            "**Parity** (2-layer random checkpoint, hidden 256, head 64, real vocabulary; a 150-token prompt, past "
            "the 128 window, then 100 greedy steps), CUDA against the CPU float32 engine "
            f"(largest logit {parity['logit_scale']}):",
            "",
            "| dtype | prompt logits, max abs diff | over the run (fed the CPU's tokens) | argmax agreement "
            "| of the disagreements, beyond a near tie | greedy tokens equal before the first difference "
            "(the CPU's top-two margin there) |",
            "|---|---|---|---|---|---|",
        ]
        for key in ("float16", "bfloat16", "qmoe_float16", "qmoe_bfloat16"):
            row = parity.get(key, {})
            label = key.replace("qmoe_", "") + (", MoE as QMoE" if key.startswith("qmoe_") else "")
            if "error" in row:
                lines.append(f"| {label} | failed: {row['error']} | | | | |")
            elif row:
                first_difference = row["greedy_tokens_equal_before_first_difference"]
                margin = row.get("cpu_margin_at_first_difference")
                lines.append(
                    f"| {label} | {row['prompt_logits_max_abs_diff']} | {row['max_abs_diff_over_run']} "
                    f"| {row['argmax_agreement_fed_cpu_tokens']} | {row.get('disagreements_beyond_a_near_tie', '-')} "
                    f"| {first_difference}" + ("" if margin is None else f" ({margin})") + " |"
                )
        lines += [
            "",
            "A near tie: a step where the CPU's top two logits lie within twice that step's largest logit "
            "difference, so either could come first within the dtype's error; random weights make many.",
            "",
        ]
    kernel = results.get("kernel", {})
    if kernel and "error" not in kernel:
        worst = max(v["max_abs_diff"] / v["output_scale"] for k, v in kernel.items() if k.startswith("float32"))
        lines += [
            f"**MXFP4MoE kernel**, CUDA against the CPU kernel on a 20b-shaped layer (1, 3, 64, 256 tokens): "
            f"float32 largest difference {worst:.1e} of the output's magnitude; bfloat16: "
            + ", ".join(
                f"{key.split('_')[-1]} tokens {v['max_abs_diff'] / v['output_scale']:.1e}"
                for key, v in kernel.items()
                if key.startswith("bfloat16_tokens_")
            )
            + " (256 tokens: the GEMM path).",
            "",
        ]
        timing = kernel.get("timing", {})
        if timing:
            lines += [
                "The layer alone (bfloat16, inputs and output in device memory, ONNX Runtime's per-run overhead "
                "included), against the expert bytes it must read:",
                "",
                "| tokens | experts routed | expert bytes | µs per layer | GB/s |",
                "|---|---|---|---|---|",
                *(
                    f"| {key.split('_')[1]} | {t['experts_routed']} | {t['expert_bytes'] / 1e6:.1f} MB | {t['us']} "
                    f"| {t['gb_per_s']} |"
                    for key, t in timing.items()
                ),
                "",
            ]
        for name, path in (("timing_cuda_cores", f"CUDA cores only ({GEMM_ENV}=0, {MMA_ENV}=0)"),
                           ("timing_mma", f"the tensor-core tiles at every size ({MMA_ENV}=1)"),
                           ("timing_mma_no_l2_prefetch",
                            f"the tensor-core tiles at every size without their L2 prefetch ({PREFETCH_ENV}=0)"),
                           ("timing_gemms", f"the GEMM path at every size ({GEMM_ENV}=1)")):  # fmt: skip
            if kernel.get(name):
                times = ", ".join(f"{key.split('_')[1]} tokens {t['us']} µs" for key, t in kernel[name].items())
                lines += [f"The layer on {path}, per layer: {times}.", ""]
        for layout, rows in kernel.get("qmoe", {}).items():
            if "error" in rows:
                lines += [f"ONNX Runtime's QMoE (fp4), weights by {layout}: failed: {rows['error']}", ""]
                continue
            worst = max(v["max_abs_diff"] / v["output_scale"] for k, v in rows.items() if k.startswith("tokens_"))
            times = ", ".join(f"{key.split('_')[1]} tokens {t['us']} µs" for key, t in rows["timing"].items())
            lines += [
                f"ONNX Runtime's QMoE (fp4), weights by {layout}: largest difference from our kernel {worst:.1e} of "
                f"the output's magnitude (1, 3, 64, 256 tokens); per layer: {times}.",
                "",
            ]
    lines += sweep_lines(results.get("sweep", {}))
    lines += attention_sweep_lines(results.get("attention_sweep", {}))
    lines += attention_lines(results.get("attention", {}))
    sampler = results.get("sampler", {})
    if sampler and "error" not in sampler:
        lines += [
            "**Sampling** at the real vocabulary (bench/sampler_bench.py's rows; ms per call for all rows, the NumPy "
            "sampler's including the copy of the logits rows to the host):",
            "",
            "| rows and kind | NumPy sampler (ms) | SampleTokens kernel (ms) |",
            "|---|---|---|",
            *(f"| {name} | {v['numpy_ms']} | {v['kernel_ms']} |" for name, v in sampler.items()),
            "",
        ]
    scale = results.get("scale", {})
    experts = f"; experts {scale['experts']}" if "experts" in scale else ""
    if "decode_tok_s_batch_1" in scale:
        lines += [
            f"**gpt-oss-20b's full shape** (random weights{experts}, bf16, 24 layers, 32 experts, 64 KV slots of "
            f"{8192 + 256} positions): checkpoint written in {scale.get('checkpoint_write_s')} s, converted in "
            f"{scale.get('convert_s')} s ({scale.get('graph_data_gb')} GB of weights written), loaded in "
            f"{scale.get('load_s')} s.",
            "",
            "| decode batch | 1 | 8 | 32 | 64 |",
            "|---|---|---|---|---|",
            "| tokens/s | " + " | ".join(str(scale.get(f"decode_tok_s_batch_{b}", "-")) for b in (1, 8, 32, 64)) + " |",
            "| tokens/s, CUDA graphs | "
            + " | ".join(str(scale.get(f"cuda_graph_decode_tok_s_batch_{b}", "-")) for b in (1, 8))
            + " | - | - |",
            *(qmoe_rows(scale)),
            "- The decode rows' runtime captured each step as a CUDA graph: "
            f"{'yes' if results.get('cuda_graph') else 'no'}; the CUDA-graph row is a runtime of 8 slots of its own.",
            f"- Copying each step's logits to the host: {scale.get('logits_copy_us_batch_1')} µs at batch 1 "
            f"({scale.get('logits_copy_share_of_step_batch_1')} of the step), {scale.get('logits_copy_us_batch_64')} "
            f"µs at batch 64 ({scale.get('logits_copy_share_of_step_batch_64')}).",
            *(
                [
                    "- 256 sequences at 2,048 positions each (KV slots of 2,304 positions, "
                    f"{scale.get('many_kv_gb_allocated')} GB of KV; the KV past the step as the buffers hold it): "
                    f"{scale.get('decode_tok_s_256_sequences_2048_context', scale.get('many_error'))} tok/s in total."
                ]
                if "many_kv_gb_allocated" in scale or "many_error" in scale
                else []
            ),
            f"- Time to first token (one prefill call): 1k prompt {scale.get('ttft_1024_s')} s, 8k prompt "
            f"{scale.get('ttft_8192_s')} s"
            + (
                f" (the process's first prompt of each length, as ONNX Runtime's arena grows for it: "
                f"{scale['ttft_1024_first_s']} s and {scale.get('ttft_8192_first_s')} s)."
                if "ttft_1024_first_s" in scale
                else " (each the process's first prompt of its length)."
            ),
            f"- Bytes a batch-1 step must read: {scale.get('weights_read_per_token_gb')} GB (the bf16 unembedding "
            f"alone {scale.get('unembedding_gb')} GB); at the measured bandwidth the bound is "
            f"{scale.get('hbm_bound_tok_s')} tok/s, so batch-1 decode runs at "
            f"**{scale.get('batch_1_fraction_of_bound')}** of it "
            f"({scale.get('cuda_graph_batch_1_fraction_of_bound')} with CUDA graphs).",
            f"- KV cache: {scale.get('kv_bytes_per_token_per_sequence')} bytes per token per sequence "
            f"({scale.get('kv_bytes_per_token_per_sequence', 0) * 1024 / 2**20:.0f} MiB per 1k tokens); "
            f"{scale.get('kv_gb_allocated')} GB allocated for the 64 slots; device memory in use after the run "
            f"{scale.get('device_memory_used_gb')} GB of {scale.get('device_memory_total_gb')} GB "
            f"(weights and ONNX Runtime's arena after an 8k prefill: {scale.get('weights_and_workspace_gb')} GB "
            "beside the KV).",
            f"- CUDA-graph decode logits against the plain runs': largest difference "
            f"{scale.get('cuda_graph_max_abs_logit_diff')} ("
            + (
                "the graphs fed the plain run's tokens)."
                if scale.get("cuda_graph_fed_plain_tokens")
                else "each run fed its own greedy tokens, so a token flipped at a near tie would move every later "
                "logit: such a run cannot tell that from an error)."
            ),
            "",
        ]
    big = results.get("scale_120b", {})
    if "decode_tok_s_batch_1" in big:
        lines += [
            f"**gpt-oss-120b's full shape** (random weights; experts {big.get('experts')}; bf16, 36 layers, 128 "
            "experts, 8 KV slots of "
            f"{4096 + 256} positions): checkpoint written in {big.get('checkpoint_write_s')} s, converted in "
            f"{big.get('convert_s')} s ({big.get('graph_data_gb')} GB written), loaded in {big.get('load_s')} s; "
            f"decode {big.get('decode_tok_s_batch_1')} tok/s at batch 1 (**{big.get('batch_1_fraction_of_bound')}** "
            f"of the {big.get('hbm_bound_tok_s')} tok/s bound), {big.get('decode_tok_s_batch_8')} tok/s at batch 8; "
            f"1k prompt's time to first token {big.get('ttft_1024_s')} s; device memory in use "
            f"{big.get('device_memory_used_gb')} GB of {big.get('device_memory_total_gb')} GB.",
            "",
        ]
    elif "error" in big:
        lines += [f"**gpt-oss-120b's full shape**: failed: {big['error'][:300]}", ""]
    lines += paged_lines(results.get("paged", {}))
    lines += host_lines(results.get("host", {}))
    lines += profile_lines(scale)
    lines.append(end)
    return "\n".join(lines)


def qmoe_rows(scale: dict[str, Any]) -> list[str]:
    """The 20b shape's decode row on ONNX Runtime's QMoE and its notes, where the run built that model."""
    if "qmoe_error" in scale:
        return ["", f"- QMoE: {scale['qmoe_error']}"]
    if "qmoe_convert_s" not in scale:
        return [""]
    return [
        "| tokens/s, MoE as ONNX Runtime's QMoE | "
        + " | ".join(str(scale.get(f"qmoe_decode_tok_s_batch_{b}", "-")) for b in (1, 8, 32, 64))
        + " |",
        "",
        f"- QMoE: converted in {scale.get('qmoe_convert_s')} s; 1k prompt's time to first token "
        f"{scale.get('qmoe_ttft_1024_s')} s; batch-1 decode at {scale.get('qmoe_batch_1_fraction_of_bound')} "
        "of the bound.",
    ]


def paged_lines(paged: dict[str, Any]) -> list[str]:
    """The paged-KV figures (engine_check's `paged` step), what of them a run reached, or why they are missing."""
    if not paged:
        return []
    if "error" in paged:
        return [f"**Paged KV at 20b's shape**: failed: {paged['error'][:300]}", ""]
    many = next((v for k, v in paged.items() if k.startswith("decode_tok_s_") and "_sequences_" in k), None)
    problems = "; ".join(f"{k}: {v[:200]}" for k, v in paged.items() if k.endswith("error"))
    text = "**Paged KV at 20b's shape** (bf16): 512 sequences at 2,048 positions decoded together at "
    text += f"{many} tok/s in total"
    if "paged_kv_gb_allocated" in paged:
        text += f" ({paged['paged_kv_gb_allocated']} GB of KV pools)"
    if "long_prefill_s_beside_64_decoding" in paged:
        text += (
            f"; a {paged.get('long_prompt_tokens')}-token prompt prefilled in"
            f" {paged['long_prefill_s_beside_64_decoding']} s in chunks beside 64 decoding sequences, which ran"
            f" {paged.get('short_decode_tok_s_during_long_prefill')} tok/s meanwhile and"
            f" {paged.get('short_decode_tok_s_alone')} tok/s alone"
        )
    text += "." + (f" Source: {paged['source']}." if "source" in paged else "")
    return [text + (f" Failed parts: {problems}." if problems else ""), ""]


def host_lines(host: dict[str, Any]) -> list[str]:
    """The host's cost per decode step (engine_check's `host` step), as a table, or why it is missing."""
    if not host:
        return []
    if "error" in host:
        return [f"**The host's cost per decode step**: failed: {host['error'][:300]}", ""]
    where = f"{host['device']}" + (f", {host['cpu']}" if host.get("cpu") else "")
    lines = [
        f"**The host's cost per decode step** ({where}; gpt-oss-20b's width and vocabulary at {host['layers']}"
        " layers, served by the engine in-process; per scheduler step while every sequence decodes;"
        " `bench/host_costs_check.py`):",
        "",
        "| sequences | step | host's part (outside the session runs) | share | session runs | waits for results"
        " | host input bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in host.items():
        if key.startswith("batch_") and isinstance(row, dict):
            lines.append(
                f"| {key.removeprefix('batch_')} | {row['loop_ms']:.2f} ms | {row['host_ms']:.3f} ms |"
                f" {row['host_share']:.1%} | {row['runs']:g} | {row['syncs']:g} | {row['input_bytes']:,} |"
            )
    return [*lines, ""]


def attention_lines(attention: dict[str, Any]) -> list[str]:
    """bench/attention_layer.py's cases: one PagedAttention node, tensor cores against the CUDA cores."""
    if not attention:
        return []
    if "error" in attention:
        return [f"**PagedAttention alone**: failed: {attention['error'][:300]}", ""]
    return [
        "**PagedAttention alone** (bench/attention_layer.py: one node at gpt-oss's heads, bf16, caches in device "
        "memory; each step on the tensor cores against the CUDA-core kernels, GATEWAY_ATTENTION_MMA=0, in the same "
        "run; KV GB/s: the keys and values a step must read, per second):",
        "",
        "| step | µs, tensor cores | µs, CUDA cores | speed-up | TFLOP/s on the tensor cores | KV GB/s there "
        "| largest difference (of the largest output) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {name.replace('_', ' ')} | {row['us_tensor_cores']} | {row['us_cuda_cores']} | {row['speedup']}x "
            f"| {row['tflops_tensor_cores']} | {row.get('kv_gb_per_s_tensor_cores') or '-'} "
            f"| {row['max_diff_relative']:.1e}" + (f"; {row['note']}" if "note" in row else "") + " |"
            for name, row in attention.items()
        ),
        "",
    ]


def kernel_name(signature: str) -> str:
    """A profiled kernel's name without its return type, anonymous namespace and arguments."""
    name = signature.replace("(anonymous namespace)::", "").removeprefix("void ")
    return name.split("(")[0][:90]


def sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """The MoE kernel's launch variants by step size (bench/moe_sweep.py): the fastest per size, against the
    kernel's built-in rule and ONNX Runtime's QMoE."""
    if not sweep or "error" in sweep:
        return [f"**MoE launch variants**: the sweep failed: {sweep['error']}", ""] if sweep else []
    lines = []
    for name in ("20b", "120b"):
        shape = sweep.get(name)
        if not shape:
            continue
        qmoe = shape.get("qmoe_us", {})
        qmoe = {} if "error" in qmoe else qmoe
        lines += [
            f"**MoE launch variants, gpt-oss-{name}'s layer** ({shape['experts']} experts, {sweep['dtype']}, on "
            f"{sweep['device']}; every variant timed at every size, the layer alone; the table the engine now reads: "
            f"`{shape['variants']}`; each variant's largest difference from the CUDA cores' output: "
            + ", ".join(f"{v} {d:.1e}" for v, d in shape.get("largest_difference_from_cores", {}).items())
            + "):",
            "",
            "| tokens | fastest | µs | the built-in rule, µs | rule ÷ fastest | QMoE, µs |",
            "|---|---|---|---|---|---|",
            *(
                f"| {size} | {fastest} | {shape['us'][fastest][size]} | {shape['us']['rule'][size]} "
                f"| {shape['rule_over_fastest'][size]} | {qmoe.get(size, '')} |"
                for size, fastest in shape["fastest"].items()
            ),
            "",
        ]
    return lines


def attention_sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """The decode attention's keys per split part by rows (bench/attention_sweep.py): the fastest per row count,
    its time against the default's (1,024) at each context."""
    if not sweep or "error" in sweep:
        return [f"**Decode attention splits**: the sweep failed: {sweep['error']}", ""] if sweep else []
    default = sweep["us"].get("1024", {})
    rows = []
    for count, keys in sweep["fastest"].items():
        mine = {case: us for case, us in sweep["us"][str(keys)].items() if case.split("x")[0] == count}
        cells = "; ".join(
            f"{case.split('x')[1]}: {us} µs ({default.get(case, 0) / us:.2f}x)" for case, us in mine.items()
        )
        rows.append(f"| {count} | {keys or 'not split'} | {cells} |")
    differences = ", ".join(f"{k} {d:.1e}" for k, d in sweep.get("largest_difference_from_default", {}).items())
    return [
        f"**Decode attention splits** (a full and a window layer's decode step, bf16, on {sweep['device']}; every keys "
        f"per split part timed at every row count and context; the table the engine now reads: `{sweep['splits']}`; "
        f"each candidate's largest difference from the default's output: {differences}):",
        "",
        "| rows | keys a part | µs at each context (the default's time over it) |",
        "|---|---|---|",
        *rows,
        "",
    ]


def _profiled(key: str) -> tuple[str, str]:
    """What a `profile_batch_N` or `profile_prefill_N` entry timed, and over what its µs are counted."""
    size = key.rsplit("_", 1)[-1]
    if key.startswith("profile_batch_") and "_at_" in key:  # profile_batch_B_at_C
        batch, context = key.removeprefix("profile_batch_").split("_at_")
        return f"decode at batch {batch} at {context} positions", "a decode step's: the mean of 4"
    if key.startswith("profile_batch_"):
        return f"decode at batch {size}", "a decode step's: the mean of 8"
    return f"a {size}-token prefill", "one prefill call, after a warm-up one"


def profile_lines(scale: dict[str, Any]) -> list[str]:
    """The device time by kernel (engine_check's profile of the 20b shape), the largest first."""
    profiles = {_profiled(key): value for key, value in scale.items() if key.startswith("profile_")}
    lines: list[str] = []
    for (what, per), profile in profiles.items():
        if "error" in profile:
            lines += [f"Device time by kernel, {what}: failed: {profile['error'][:300]}", ""]
            continue
        lines += [
            f"Device time by kernel, {what}: {profile['gpu_us_per_step']} µs in all ({per}; torch's profiler), the"
            " largest ten:",
            "",
            "| kernel | µs | launches |",
            "|---|---|---|",
            *(
                f"| `{kernel_name(kernel['name'])}` | {kernel['us_per_step']} | {kernel['launches_per_step']:g} |"
                for kernel in profile["kernels"][:10]
            ),
            "",
        ]
    return lines
