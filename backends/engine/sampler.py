"""Choosing each sequence's next token from its logits row: the rows the SampleTokens kernels take (built here
from each sequence's sampling parameters, generator, grammar mask and generated tokens), and those kernels'
arithmetic in NumPy (kernels/sample_tokens_launch.h states it): the reference the kernels are tested
against, and the sampler where the kernel library is not loaded.

Per row: the presence and frequency penalties on the text tokens generated so far and the grammar's mask;
greedy at temperature 0, else temperature and nucleus (top-p), drawn by one uniform number from the
sequence's generator; and the chosen token's log-probability under the penalised, masked logits (before
temperature and top-p) with the most likely alternatives."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.base import Sampling, TokenLogprob

NO_PENALTY = 2**31 - 1  # penalty_ids padding: sorts after every token id
MAX_TOP_LOGPROBS = 20
LEAST_TARGET = 1e-300  # top_p 0 keeps the most likely token: a target above zero
BELOW_ONE = np.float32(1.0) - np.float32(2.0**-24)  # the largest float32 below 1


@dataclass(slots=True)
class RowSpec:
    """One sequence's next choice: where its logits are and how to choose."""

    row: int  # its row of logits
    sampling: Sampling
    rng: np.random.Generator
    mask: np.ndarray | None = None  # uint32 words, bit i set where the grammar allows token i
    counts: dict[int, int] | None = None  # text tokens generated so far (for the penalties)
    top_logprobs: int | None = None  # None: no logprobs


@dataclass(slots=True)
class SamplingRows:
    """The SampleTokens op's inputs but the logits (kernels/sample_tokens_op.h names each)."""

    rows: np.ndarray  # int32 [R]
    temperature: np.ndarray  # float32 [R]
    top_p: np.ndarray  # float32 [R]
    uniform: np.ndarray  # float32 [R]
    mask_index: np.ndarray  # int32 [R]
    masks: np.ndarray  # int32 [M, W]
    penalty_ids: np.ndarray  # int32 [R, P]
    penalty_values: np.ndarray  # float32 [R, P]
    logprobs: np.ndarray  # int32 [R]
    top: int

    def inputs(self) -> dict[str, np.ndarray]:
        """By the op's input names."""
        named = {name: getattr(self, name) for name in SAMPLER_INPUTS if name not in ("logits", "top")}
        return {**named, "top": np.array([self.top], np.int64)}


SAMPLER_INPUTS = (
    "logits", "rows", "temperature", "top_p", "uniform", "mask_index", "masks", "penalty_ids", "penalty_values",
    "logprobs", "top",
)  # fmt: skip
SAMPLER_OUTPUTS = ("token", "logprob", "top_ids", "top_logprobs")


def _uniform(spec: RowSpec) -> np.float32:
    if spec.sampling.temperature <= 0:
        return np.float32(0.0)
    return min(np.float32(spec.rng.random()), BELOW_ONE)


def _penalties(spec: RowSpec) -> tuple[np.ndarray, np.ndarray]:
    """The row's penalised tokens, ascending, and what each one's logit loses."""
    sampling = spec.sampling
    if not spec.counts or (sampling.presence_penalty == 0 and sampling.frequency_penalty == 0):
        return np.zeros(0, np.int32), np.zeros(0, np.float32)
    count = len(spec.counts)
    ids = np.fromiter(spec.counts.keys(), np.int32, count)
    times = np.fromiter(spec.counts.values(), np.float64, count)
    order = np.argsort(ids)
    values = sampling.frequency_penalty * times[order] + sampling.presence_penalty
    return ids[order], values.astype(np.float32)


def sampling_rows(specs: list[RowSpec], vocab: int) -> SamplingRows:
    """The op's inputs for these rows; draws each sampling row's uniform number from its generator."""
    count = len(specs)
    words = (vocab + 31) // 32
    masked = [spec.mask for spec in specs if spec.mask is not None]
    masks = np.stack(masked).view(np.int32) if masked else np.zeros((0, words), np.int32)
    mask_index = np.full(count, -1, np.int32)
    penalties = [_penalties(spec) for spec in specs]
    width = max((len(ids) for ids, _ in penalties), default=0)
    penalty_ids = np.full((count, width), NO_PENALTY, np.int32)
    penalty_values = np.zeros((count, width), np.float32)
    position = 0
    for index, (spec, (ids, values)) in enumerate(zip(specs, penalties, strict=True)):
        if spec.mask is not None:
            mask_index[index] = position
            position += 1
        penalty_ids[index, : len(ids)] = ids
        penalty_values[index, : len(ids)] = values
    logprobs = np.array([-1 if s.top_logprobs is None else s.top_logprobs for s in specs], np.int32)
    return SamplingRows(
        rows=np.array([spec.row for spec in specs], np.int32),
        temperature=np.array([spec.sampling.temperature for spec in specs], np.float32),
        top_p=np.array([spec.sampling.top_p for spec in specs], np.float32),
        uniform=np.array([_uniform(spec) for spec in specs], np.float32),
        mask_index=mask_index,
        masks=masks,
        penalty_ids=penalty_ids,
        penalty_values=penalty_values,
        logprobs=logprobs,
        top=int(min(MAX_TOP_LOGPROBS, max(0, int(logprobs.max(initial=0))))),
    )


@dataclass(frozen=True, slots=True)
class Sampled:
    """The op's outputs: a token per row (-1: every token masked) and the logprobs asked for."""

    tokens: np.ndarray  # int64 [R]
    logprob: np.ndarray  # float32 [R]
    top_ids: np.ndarray  # int32 [R, K]
    top_logprobs: np.ndarray  # float32 [R, K]

    def entry(self, index: int, wanted: int | None) -> TokenLogprob | None:
        """Row `index`'s logprobs, when `wanted` (its top_logprobs) asked for them."""
        if wanted is None:
            return None
        ids, values = self.top_ids[index, :wanted].tolist(), self.top_logprobs[index, :wanted].tolist()
        alternatives = zip(ids, values, strict=True)
        return TokenLogprob(float(self.logprob[index]), tuple((t, v) for t, v in alternatives if t >= 0))


def _penalised(logits: np.ndarray, rows: SamplingRows, r: int) -> np.ndarray:
    z = logits[rows.rows[r]].astype(np.float32, copy=True)
    vocab = len(z)
    ids, values = rows.penalty_ids[r], rows.penalty_values[r]
    valid = (ids != NO_PENALTY) & (ids >= 0) & (ids < vocab)
    z[ids[valid]] -= values[valid]
    mask = int(rows.mask_index[r])
    if 0 <= mask < len(rows.masks):
        bits = rows.masks[mask].view(np.uint32)
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab].view(bool)
        z[~allowed] = -np.inf
    return z


def _nucleus(e: np.ndarray, total: float, top_p: np.float32) -> tuple[np.float32, int, float]:
    """(tau, ties kept at tau, kept mass)."""
    if not top_p < 1:
        return np.float32(0.0), 0, total
    target = max(float(top_p) * total, LEAST_TARGET)
    order = np.lexsort((np.arange(len(e)), -e))
    running = np.cumsum(e[order], dtype=np.float64)
    crossing = min(int(np.searchsorted(running, target, side="left")), len(e) - 1)
    tau = e[order[crossing]]
    greater = float(e[e > tau].sum(dtype=np.float64))
    ties = 0
    if tau > 0:
        ties = int(np.clip(np.ceil((target - greater) / float(tau)), 1, int((e == tau).sum())))
    return tau, ties, greater + ties * float(tau)


def _draw(e: np.ndarray, tau: np.float32, ties: int, mass: float, uniform: np.float32) -> int:
    equal = e == tau
    kept = (e > tau) | (equal & (tau > 0) & (np.cumsum(equal) <= ties))
    running = np.cumsum(np.where(kept, e, 0), dtype=np.float64)
    passed = kept & (running > float(uniform) * mass)
    if passed.any():
        return int(np.argmax(passed))
    return int(np.flatnonzero(kept)[-1]) if kept.any() else -1


def sample_rows(logits: np.ndarray, rows: SamplingRows) -> Sampled:
    """The SampleTokens op on the host: `logits` [N, V] float32."""
    count, top = len(rows.rows), rows.top
    tokens = np.full(count, -1, np.int64)
    logprob = np.zeros(count, np.float32)
    top_ids = np.full((count, top), -1, np.int32)
    top_logprobs = np.full((count, top), -np.inf, np.float32)
    for r in range(count):
        if not 0 <= rows.rows[r] < len(logits):
            continue
        z = _penalised(logits, rows, r)
        peak = z.max()
        if peak == -np.inf:
            continue
        token = int(np.argmax(z))
        temperature = rows.temperature[r]
        if temperature > 0:
            e = np.exp((z - peak) * (np.float32(1.0) / temperature))
            tau, ties, mass = _nucleus(e, float(e.sum(dtype=np.float64)), rows.top_p[r])
            token = _draw(e, tau, ties, mass, rows.uniform[r])
        tokens[r] = token
        if rows.logprobs[r] < 0:
            continue
        log_total = float(np.log(np.exp(z - peak).sum(dtype=np.float64)))
        logprob[r] = np.float32(float(z[token] - peak) - log_total)
        finite = np.flatnonzero(z != -np.inf)
        wanted = min(int(rows.logprobs[r]), top, len(finite))
        best = finite[np.lexsort((finite, -z[finite]))][:wanted]
        top_ids[r, :wanted] = best
        top_logprobs[r, :wanted] = [np.float32(float(z[t] - peak) - log_total) for t in best]
    return Sampled(tokens, logprob, top_ids, top_logprobs)
