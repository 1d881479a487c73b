"""The engine's logits equal an independent NumPy forward pass (fp32 CPU, within 1e-4) over a prompt and
300 generated tokens, past the 128-token window, in both checkpoint layouts; and batched decoding
produces exactly the tokens each sequence produces alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_fixtures import export_model, make_checkpoint, tiny_config
from engine_reference import ReferenceModel

from backends.engine.paged_runner import PagedRunner

PROMPT = [200006, 17360, 200008, 3575, 553, 17554, 162016, 11, 261, 4410, 2359, 2420, 13, 200007, 200006]
GENERATED = 300
TOLERANCE = 1e-4


@pytest.mark.parametrize(
    ("experts", "top_k", "layout"),
    [(4, 2, "original"), (8, 4, "hf"), (8, 2, "original"), (4, 4, "hf")],
)
def test_logits_match_the_reference_over_a_long_greedy_run(tmp_path, experts, top_k, layout):
    config = tiny_config(experts=experts, top_k=top_k)
    engine_dir = make_checkpoint(tmp_path / layout, config, layout)
    reference_dir = make_checkpoint(tmp_path / "reference", config, "original")  # same seed: same weights
    runtime = PagedRunner.create(export_model(engine_dir, 512), config, 1, 512)
    reference = ReferenceModel(reference_dir)

    logits = runtime.prefill(0, PROMPT)
    for position, token in enumerate(PROMPT):
        expected = reference.step(token, position)
    worst = float(np.abs(logits - expected).max())
    engine_tokens, reference_tokens = [], []
    position = len(PROMPT)
    for _ in range(GENERATED):
        engine_tokens.append(int(np.argmax(logits)))
        reference_tokens.append(int(np.argmax(expected)))
        token = reference_tokens[-1]
        logits = runtime.decode([(0, token, position)])[0]
        expected = reference.step(token, position)
        worst = max(worst, float(np.abs(logits - expected).max()))
        position += 1
    assert position > 2 * config.sliding_window
    assert worst < TOLERANCE, f"largest logit difference {worst:.2e}"
    assert engine_tokens == reference_tokens
    assert len(set(engine_tokens)) > 10  # a real run, not one token repeated


def test_a_prompt_prefilled_in_chunks_matches_the_reference(tmp_path):
    """Chunks continue the slot's cache (past the 128 window here), as the batcher feeds long prompts."""
    config = tiny_config()
    directory = make_checkpoint(tmp_path, config, "original")
    runtime = PagedRunner.create(export_model(directory, 512), config, 1, 512)
    reference = ReferenceModel(directory)
    prompt = np.random.default_rng(3).integers(0, 199_000, size=200).tolist()
    for start in range(0, len(prompt), 64):
        logits = runtime.prefill(0, prompt[start : start + 64], start)
    for position, token in enumerate(prompt):
        expected = reference.step(token, position)
    worst = float(np.abs(logits - expected).max())
    for position in range(len(prompt), len(prompt) + 20):
        token = int(np.argmax(expected))
        logits = runtime.decode([(0, token, position)])[0]
        expected = reference.step(token, position)
        worst = max(worst, float(np.abs(logits - expected).max()))
    assert worst < TOLERANCE, f"largest logit difference {worst:.2e}"


def _greedy_alone(runtime: PagedRunner, prompt: list[int], count: int) -> list[int]:
    logits, position, out = runtime.prefill(0, prompt), len(prompt), []
    for _ in range(count):
        out.append(int(np.argmax(logits)))
        logits = runtime.decode([(0, out[-1], position)])[0]
        position += 1
    return out


def test_batched_decoding_gives_each_sequence_its_own_tokens(tmp_path: Path):
    config = tiny_config()
    runtime = PagedRunner.create(export_model(make_checkpoint(tmp_path, config, "original"), 256), config, 4, 256)
    prompts = [PROMPT, [1000, 2000, 3000], list(range(5, 40)), [42]]
    count = 40
    alone = [_greedy_alone(runtime, prompt, count) for prompt in prompts]

    joins = {0: 0, 3: 1, 4: 2, 11: 3}  # step → prompt: sequences join between decode steps
    slots = {0: 2, 1: 0, 2: 3, 3: 1}  # prompt → slot, not in join order
    state: dict[int, tuple[int, int]] = {}  # prompt → (next token, position)
    together: dict[int, list[int]] = {index: [] for index in range(len(prompts))}
    for step in range(count + 12):
        if step in joins:
            index = joins[step]
            first = int(np.argmax(runtime.prefill(slots[index], prompts[index])))
            together[index].append(first)
            state[index] = (first, len(prompts[index]))
        rows = [(slots[i], token, position) for i, (token, position) in state.items() if len(together[i]) < count]
        if not rows:
            break
        logits = runtime.decode(rows)
        for index, (_, position) in list(state.items()):
            if len(together[index]) < count:
                chosen = int(np.argmax(logits[slots[index]]))
                together[index].append(chosen)
                state[index] = (chosen, position + 1)
    assert together == dict(enumerate(alone))


def test_logits_returned_by_a_step_are_not_overwritten_by_the_next(tmp_path: Path):
    config = tiny_config()
    runtime = PagedRunner.create(export_model(make_checkpoint(tmp_path, config, "original"), 64), config, 1, 64)
    first = runtime.prefill(0, [5, 6, 7])
    kept = first.copy()
    runtime.decode([(0, int(np.argmax(first)), 3)])
    assert np.array_equal(first, kept)
