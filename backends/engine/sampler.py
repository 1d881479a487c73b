"""Choosing the next token from logits: the presence and frequency penalties on the text tokens generated so
far, then greedy at temperature 0, else temperature and nucleus (top-p); and the chosen token's log-probability
under those logits (penalised and masked, before temperature and top-p)."""

from __future__ import annotations

import numpy as np

from backends.base import Sampling, TokenLogprob


def penalised(logits: np.ndarray, sampling: Sampling, counts: dict[int, int]) -> np.ndarray:
    """The logits less each generated token's penalties (`counts`: how often each text token was generated)."""
    if not counts or (sampling.presence_penalty == 0 and sampling.frequency_penalty == 0):
        return logits
    ids = np.fromiter(counts.keys(), np.int64, len(counts))
    times = np.fromiter(counts.values(), np.float64, len(counts))
    adjusted = logits.astype(np.float64)
    adjusted[ids] -= sampling.frequency_penalty * times + sampling.presence_penalty
    return adjusted


def next_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """From logits already penalised (`penalised`) and masked by the output's grammar."""
    if sampling.temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    scaled -= scaled.max()
    probabilities = np.exp(scaled)
    probabilities /= probabilities.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-probabilities, kind="stable")
        cumulative = np.cumsum(probabilities[order])
        keep = order[: int(np.searchsorted(cumulative, sampling.top_p)) + 1]
        return int(keep[rng.choice(len(keep), p=probabilities[keep] / probabilities[keep].sum())])
    return int(rng.choice(len(probabilities), p=probabilities))


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """The exact log-softmax at `token`, and the `top` most likely tokens with theirs (a masked token, at minus
    infinity, is never among them)."""
    values = logits.astype(np.float64)
    peak = values.max()
    normaliser = peak + np.log(np.exp(values - peak).sum())
    best: tuple[tuple[int, float], ...] = ()
    if top:
        candidates = np.argpartition(-values, top)[:top] if top < len(values) else np.arange(len(values))
        ordered = candidates[np.argsort(-values[candidates], kind="stable")]
        best = tuple((int(i), float(values[i] - normaliser)) for i in ordered if np.isfinite(values[i]))
    return TokenLogprob(float(values[token] - normaliser), best)
