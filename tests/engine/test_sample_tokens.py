"""The SampleTokens kernels (the engine's sampler): the compiled CPU kernel and the CUDA kernel file (run on the
host under the warp emulation) against the NumPy reference in backends/engine/sampler.py, at gpt-oss's
vocabulary (201,088): greedy, temperature, nucleus, grammar masks, penalties, logprobs with alternatives;
and the draws' distribution against the nucleus's probabilities."""

from __future__ import annotations

import ctypes

import numpy as np
import onnxruntime as ort
import pytest
from emulated_kernels import compile_emulated

from backends.base import Sampling
from backends.engine.kernels import build
from backends.engine.sampler import RowSpec, Sampled, SamplingRows, sample_rows, sampling_rows
from backends.engine.sampling_session import SamplingSession

VOCAB = 201088
ptr = ctypes.c_void_p


def _session(logits: np.ndarray) -> SamplingSession:
    value = ort.OrtValue.ortvalue_from_numpy(logits)
    return SamplingSession(build.build_library(), ["CPUExecutionProvider"], ("cpu", 0), value)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> ctypes.CDLL:
    directory = tmp_path_factory.mktemp("emulation")
    return compile_emulated(build.SAMPLE_CUDA_SOURCE, "sample_emulation_driver.cc", "gptoss_emulated_sample", directory)


def _emulate(handle: ctypes.CDLL, logits: np.ndarray, rows: SamplingRows) -> Sampled:
    count, top = len(rows.rows), rows.top
    out = Sampled(
        np.zeros(count, np.int64), np.zeros(count, np.float32), np.zeros((count, top), np.int32),
        np.zeros((count, top), np.float32),
    )  # fmt: skip
    arrays = [np.ascontiguousarray(a) for a in (rows.masks, rows.penalty_ids, rows.penalty_values)]
    error = handle.gptoss_emulated_sample(
        ctypes.c_int64(count), ctypes.c_int64(logits.shape[1]), ctypes.c_int64(logits.shape[0]),
        ptr(logits.ctypes.data), ptr(rows.rows.ctypes.data), ptr(rows.temperature.ctypes.data),
        ptr(rows.top_p.ctypes.data), ptr(rows.uniform.ctypes.data), ptr(rows.mask_index.ctypes.data),
        ptr(arrays[0].ctypes.data), ctypes.c_int64(arrays[0].shape[0]), ctypes.c_int64(arrays[0].shape[1]),
        ptr(arrays[1].ctypes.data), ptr(arrays[2].ctypes.data), ctypes.c_int64(arrays[1].shape[1]),
        ptr(rows.logprobs.ctypes.data), ctypes.c_int64(top), ptr(out.tokens.ctypes.data),
        ptr(out.logprob.ctypes.data), ptr(out.top_ids.ctypes.data), ptr(out.top_logprobs.ctypes.data),
    )  # fmt: skip
    assert error is None, error
    return out


def _mixed_rows(logits: np.ndarray, seed: int) -> SamplingRows:
    """Rows of every kind: greedy and sampled, nucleus from 0 to 1, masks, penalties, logprobs of 0..20."""
    rng = np.random.default_rng(seed)
    temperatures, top_ps, tops = (0.0, 1.0, 0.6, 1.4), (1.0, 0.9, 0.3, 0.0, 0.999), (None, 0, 3, 20)
    specs = []
    for index in range(len(logits)):
        mask = None
        if index % 3 == 0:  # a grammar allowing a random half of the vocabulary (the row's best token among them)
            mask = rng.integers(0, 2**32, (VOCAB + 31) // 32, dtype=np.uint64).astype(np.uint32)
            best = int(np.argmax(logits[index]))
            mask[best // 32] |= np.uint32(1 << (best % 32))
        counts = {int(t): int(rng.integers(1, 4)) for t in rng.choice(VOCAB, size=index * 7 % 40, replace=False)}
        counts[int(np.argmax(logits[index]))] = 2  # the favourite penalised: the penalty changes the answer
        sampling = Sampling(
            temperature=temperatures[index % 4],
            top_p=top_ps[index // 2 % 5],
            presence_penalty=0.5 if index % 2 else 0.0,
            frequency_penalty=1.5,
        )
        specs.append(RowSpec(index, sampling, np.random.default_rng(seed + index), mask, counts, tops[index % 4]))
    return sampling_rows(specs, VOCAB)


def _logits(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, VOCAB)) * 2.5).astype(np.float32)
    logits[:, :64] += 6.0  # a peaked head, so that the nucleus is small and its threshold matters
    if rows > 4:
        logits[4, 1000:1010] = logits[4].max() + 1  # ties at the top: the lowest index wins
    return logits


def _assert_same(got: Sampled, want: Sampled, rows: SamplingRows) -> None:
    assert got.tokens.tolist() == want.tokens.tolist()
    asked = rows.logprobs >= 0
    np.testing.assert_allclose(got.logprob[asked], want.logprob[asked], atol=2e-6)
    assert got.top_ids.tolist() == want.top_ids.tolist()
    np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, atol=2e-6)


def test_cpu_kernel_equals_the_reference_at_the_real_vocabulary():
    logits = _logits(24, 1)
    rows = _mixed_rows(logits, 7)
    got = _session(logits).sample(rows)
    want = sample_rows(logits, rows)
    _assert_same(got, want, rows)
    # row 4 is greedy; of its ten equal best logits the first is penalised: the lowest index of the other nine
    assert got.tokens[4] == 1001
    for r in np.flatnonzero(rows.mask_index >= 0):  # a masked token is never chosen
        bits = rows.masks[rows.mask_index[r]].view(np.uint32)
        assert bits[got.tokens[r] // 32] >> (got.tokens[r] % 32) & 1
    assert (got.top_ids[rows.logprobs == 20] >= 0).all()
    assert (got.top_ids[rows.logprobs == 3, 3:] == -1).all()


def test_cuda_kernel_under_emulation_equals_the_cpu_kernel(emulated):
    logits = _logits(12, 2)
    rows = _mixed_rows(logits, 11)
    _assert_same(_emulate(emulated, logits, rows), _session(logits).sample(rows), rows)


def _grid_rows(count: int, temperature: float, top_p: float, top: int = 0) -> SamplingRows:
    """`count` rows of logits row 0, their uniform numbers an even grid over [0, 1)."""
    specs = [RowSpec(0, Sampling(temperature, top_p), np.random.default_rng(0)) for _ in range(count)]
    rows = sampling_rows(specs, VOCAB)
    rows.uniform = ((np.arange(count) + 0.5) / count).astype(np.float32)
    return rows


def _nucleus_probabilities(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    p = np.exp((logits.astype(np.float64) - logits.max()) / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
    kept = np.zeros_like(p)
    kept[keep] = p[keep] / p[keep].sum()
    return kept


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8), (1.5, 0.5)])
def test_draws_follow_the_nucleus_probabilities(emulated, temperature, top_p):
    logits = np.full((1, VOCAB), -30.0, np.float32)
    logits[0, [3, 70000, 120, 201087, 5000, 9]] = [2.0, 1.5, 1.0, 0.5, 0.0, -1.0]
    want = _nucleus_probabilities(logits[0], temperature, top_p)
    rows = _grid_rows(2000, temperature, top_p)
    cpu = _session(logits).sample(rows)
    frequencies = np.bincount(cpu.tokens, minlength=VOCAB) / len(rows.rows)
    np.testing.assert_allclose(frequencies, want, atol=1.0 / len(rows.rows))
    small = _grid_rows(12, temperature, top_p)  # the emulation runs a row in about 0.25 s
    assert _emulate(emulated, logits, small).tokens.tolist() == _session(logits).sample(small).tokens.tolist()


def test_ties_at_the_threshold_keep_the_lowest_indices(emulated):
    logits = np.full((1, VOCAB), -50.0, np.float32)
    logits[0, [10, 20, 30, 40]] = 1.0  # four equal tokens: a nucleus of 0.5 keeps two of them, 10 and 20
    rows = _grid_rows(8, 1.0, 0.5)
    for sampled in (_session(logits).sample(rows), _emulate(emulated, logits, rows), sample_rows(logits, rows)):
        assert sampled.tokens.tolist() == [10] * 4 + [20] * 4  # the grid draws them in index order


def test_rows_with_nothing_allowed_or_no_logits_get_minus_one(emulated):
    logits = _logits(2, 3)
    specs = [
        RowSpec(0, Sampling(1.0), np.random.default_rng(0), np.zeros((VOCAB + 31) // 32, np.uint32), None, 2),
        RowSpec(5, Sampling(0.0), np.random.default_rng(0), None, None, 2),  # past the logits' rows
        RowSpec(1, Sampling(0.0), np.random.default_rng(0), None, None, None),
    ]
    rows = sampling_rows(specs, VOCAB)
    for sampled in (_session(logits).sample(rows), _emulate(emulated, logits, rows), sample_rows(logits, rows)):
        assert sampled.tokens.tolist() == [-1, -1, int(np.argmax(logits[1]))]
        assert sampled.top_ids[:2].tolist() == [[-1, -1], [-1, -1]]


def test_bad_shapes_are_refused_naming_the_input():
    logits = _logits(1, 4)
    rows = _grid_rows(2, 1.0, 1.0)
    rows.temperature = rows.temperature[:1]
    with pytest.raises(Exception, match="must be \\[R\\]"):
        _session(logits).sample(rows)
    rows = _grid_rows(2, 1.0, 1.0)
    rows.top = 21
    with pytest.raises(Exception, match=r"top must be 0\.\.20"):
        _session(logits).sample(rows)
