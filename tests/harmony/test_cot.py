"""The CoT policy: the seeds' rule, and where it knowingly differs from openai-harmony 0.0.8."""

from __future__ import annotations

from reference import reference_encoding, reference_render
from test_render_rules import COT_CASES

from harmony import CotPolicy, apply_cot_policy


def _analysis_texts(messages):
    return [m.text for m in messages if m.channel == "analysis"]


def test_seeds_drop_the_cot_of_every_completed_turn(renderer):
    messages = COT_CASES["keep_analysis_between_finals"]
    assert _analysis_texts(apply_cot_policy(messages, CotPolicy.SEEDS)) == []
    assert _analysis_texts(apply_cot_policy(messages, CotPolicy.REFERENCE)) == ["t2", "t3"]
    # the divergence, visible in the prompts
    ours = renderer.encoding.decode(renderer.render_for_completion(messages))
    ref = reference_encoding().decode_utf8(reference_render(messages, "completion", CotPolicy.REFERENCE))
    assert "t2" not in ours and "t3" not in ours
    assert "<|channel|>analysis<|message|>t2<|end|>" in ref and "<|channel|>analysis<|message|>t3<|end|>" in ref


def test_seeds_keep_the_turn_in_progress_and_drop_older_turns(renderer):
    messages = COT_CASES["tool_loop_in_progress_after_completed_turn"]
    assert _analysis_texts(apply_cot_policy(messages, CotPolicy.SEEDS)) == ["need weather"]
    # the reference drops nothing while a tool loop is in progress, stale CoT included
    assert _analysis_texts(apply_cot_policy(messages, CotPolicy.REFERENCE)) == ["old thoughts", "need weather"]
    prompt = renderer.encoding.decode(renderer.render_for_completion(messages))
    assert "need weather" in prompt and "old thoughts" not in prompt


def test_policies_agree_on_a_single_completed_tool_turn(renderer):
    messages = COT_CASES["tool_round_trip_then_final"]
    assert apply_cot_policy(messages, CotPolicy.SEEDS) == apply_cot_policy(messages, CotPolicy.REFERENCE)
    kept = apply_cot_policy(messages, CotPolicy.SEEDS)
    assert _analysis_texts(kept) == [] and [m.recipient for m in kept if m.recipient] == [
        "functions.get_weather",
        "assistant",
    ]
    assert renderer.render_for_completion(messages) == reference_render(messages, "completion", CotPolicy.REFERENCE)


def test_keep_all_keeps_everything():
    for messages in COT_CASES.values():
        assert apply_cot_policy(messages, CotPolicy.KEEP_ALL) == messages
