"""Choosing the next token from logits: greedy at temperature 0, else temperature and nucleus (top-p)."""

from __future__ import annotations

import numpy as np

from backends.base import Sampling


def next_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
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
