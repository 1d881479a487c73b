"""Property-based differential tests: generated conversations and schemas, token-exact."""

from __future__ import annotations

from hypothesis import given
from reference import reference_render
from strategies import conversations, schemas

from harmony import CotPolicy, DeveloperContent, Message, Role, ToolDescription, apply_cot_policy


@given(schemas)
def test_generated_schemas_render_like_the_reference(renderer, schema):
    developer = DeveloperContent().with_function_tools([ToolDescription("f", "d", schema)])
    messages = [Message.of(Role.DEVELOPER, developer)]
    assert renderer.render_conversation(messages) == reference_render(messages, "conversation", CotPolicy.KEEP_ALL)


@given(conversations)
def test_generated_conversations_render_like_the_reference(renderer, messages):
    for policy in (CotPolicy.REFERENCE, CotPolicy.KEEP_ALL):
        assert renderer.render_for_completion(messages, cot=policy) == reference_render(messages, "completion", policy)
        assert renderer.render_for_training(messages, cot=policy) == reference_render(messages, "training", policy)


@given(conversations)
def test_seeds_policy_differs_from_the_reference_only_by_the_dropped_cot(renderer, messages):
    kept = apply_cot_policy(messages, CotPolicy.SEEDS)
    assert all(m.channel == "analysis" for m in messages if m not in kept)
    assert renderer.render_for_completion(messages) == reference_render(kept, "completion", CotPolicy.KEEP_ALL)
