"""Choosing the next tokens at gpt-oss's vocabulary (201,088): the SampleTokens kernel beside the NumPy sampler
(the engine's sampler without the compiled kernels), in one run.

    python bench/sampler_bench.py [--device cpu|cuda] [--repeats 20] [--write docs/benchmarks.md]

Per batch (1, 8, 64 rows; 256 on CUDA) and kind of row (greedy; temperature 1 with top_p 1, gpt-oss's
recommended sampling; temperature 1 with top_p 0.9, a presence penalty on 200 tokens and 5 logprobs), the
median time of one call for all rows. On CUDA the logits live on the device: the NumPy sampler's time includes
copying the rows to the host (as the engine's step would), the kernel's includes its inputs' upload and its
outputs' download. Both choose the same tokens (checked on each kind's first call).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.base import Sampling  # noqa: E402
from backends.engine.kernels.build import kernel_library  # noqa: E402
from backends.engine.sampler import RowSpec, sample_rows, sampling_rows  # noqa: E402
from backends.engine.sampling_session import SamplingSession  # noqa: E402
from bench.report import markers, write_section  # noqa: E402

NAME = "sampler_bench"
VOCAB = 201_088
KINDS = {
    "greedy": (Sampling(temperature=0), None, 0),
    "temperature 1, top_p 1": (Sampling(temperature=1.0), None, 0),
    "top_p 0.9, penalty on 200 tokens, 5 logprobs": (
        Sampling(temperature=1.0, top_p=0.9, presence_penalty=0.5),
        5,
        200,
    ),
}


def _logits(rows: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((rows, VOCAB)) * 2.0).astype(np.float32)
    logits[:, rng.choice(VOCAB, 40, replace=False)] += 8.0  # a peaked head, as a trained model's rows are
    return logits


def _median_ms(run, repeats: int) -> float:
    """The median of `repeats` timed calls after a warm-up one; 3 where a call takes over 0.2 s (the NumPy
    sampler at many rows), so that a device's minutes go to the kernel."""
    started = time.perf_counter()
    run()
    if time.perf_counter() - started > 0.2:
        repeats = min(repeats, 3)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(device: str, batches: tuple[int, ...], repeats: int) -> list[tuple[int, str, float, float]]:
    """(batch, kind, NumPy ms, kernel ms) per batch and kind."""
    import onnxruntime as ort

    library = kernel_library()
    if library is None:
        raise SystemExit("the kernel library could not be built here")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    results = []
    for batch in batches:
        host = _logits(batch)
        value = ort.OrtValue.ortvalue_from_numpy(host, device, 0)
        session = SamplingSession(library, providers, (device, 0), value)
        for kind, (sampling, top, penalised) in KINDS.items():
            counts = {int(t): 1 for t in np.random.default_rng(1).choice(VOCAB, penalised, replace=False)}
            specs = [RowSpec(r, sampling, np.random.default_rng(r), None, counts, top) for r in range(batch)]
            rows = sampling_rows(specs, VOCAB)
            got, want = session.sample(rows).tokens, sample_rows(value.numpy(), rows).tokens
            assert got.tolist() == want.tolist(), (kind, batch)
            numpy_ms = _median_ms(lambda rows=rows, value=value: sample_rows(value.numpy(), rows), repeats)
            kernel_ms = _median_ms(lambda rows=rows, session=session: session.sample(rows), repeats)
            results.append((batch, kind, numpy_ms, kernel_ms))
            print(f"batch {batch:>3} {kind}: numpy {numpy_ms:.2f} ms, kernel {kernel_ms:.2f} ms", flush=True)
    return results


def section(device: str, repeats: int, results: list[tuple[int, str, float, float]]) -> str:
    import onnxruntime as ort

    start, end = markers(NAME)
    rows = [
        f"| {batch} | {kind} | {numpy_ms:.2f} | {kernel_ms:.2f} | {numpy_ms / kernel_ms:.1f}x |"
        for batch, kind, numpy_ms, kernel_ms in results
    ]
    return "\n".join(
        [
            start,
            f"## Sampling at the real vocabulary (`bench/sampler_bench.py`, {device})",
            "",
            f"`python bench/sampler_bench.py --device {device} --repeats {repeats}` on {platform.machine()}, "
            f"{os.cpu_count()} CPUs; Python {platform.python_version()}, onnxruntime {ort.__version__}. Median ms "
            "of one call choosing every row's next token; both samplers chose the same tokens.",
            "",
            "| rows | kind | NumPy sampler (ms) | SampleTokens kernel (ms) | kernel speed-up |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "The engine samples every step through the kernel where the compiled kernels load (the NumPy sampler "
            "otherwise); on CUDA, bench/engine_check.py's sampler step runs this with the logits on the device.",
            end,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--write", type=Path, help="write the section into this markdown file")
    args = parser.parse_args()
    batches = (1, 8, 64, 256) if args.device == "cuda" else (1, 8, 64)
    text = section(args.device, args.repeats, measure(args.device, batches, args.repeats))
    print(text)
    if args.write:
        write_section(args.write, NAME, text)


if __name__ == "__main__":
    main()
