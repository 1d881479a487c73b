"""Bridge to openai-harmony (the reference renderer), run offline on the packaged vocabulary."""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache
from typing import Any

from harmony import cot, types
from harmony.vocab import packaged_copy


def offline_vocab_dir() -> str:
    directory = os.path.join(tempfile.gettempdir(), "gpt-oss-gateway-test-vocab")
    target = os.path.join(directory, "o200k_base.tiktoken")
    if not os.path.exists(target):
        os.makedirs(directory, exist_ok=True)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(packaged_copy())
        os.replace(tmp, target)
    return directory


@lru_cache(maxsize=1)
def harmony_module() -> Any:
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", offline_vocab_dir())
    import openai_harmony

    return openai_harmony


@lru_cache(maxsize=1)
def reference_encoding() -> Any:
    oh = harmony_module()
    return oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)


def _namespaces(tools: dict[str, types.ToolNamespace] | None) -> dict[str, Any] | None:
    if tools is None:
        return None
    oh = harmony_module()
    return {
        key: oh.ToolNamespaceConfig(
            name=ns.name,
            description=ns.description,
            tools=[
                oh.ToolDescription(name=t.name, description=t.description, parameters=t.parameters) for t in ns.tools
            ],
        )
        for key, ns in tools.items()
    }


def _content(part: types.Content) -> Any:
    oh = harmony_module()
    if isinstance(part, str):
        return oh.TextContent(text=part)
    if isinstance(part, types.SystemContent):
        channel_config = None
        if part.channel_config is not None:
            channel_config = oh.ChannelConfig(
                valid_channels=list(part.channel_config.valid_channels),
                channel_required=part.channel_config.channel_required,
            )
        effort = None if part.reasoning_effort is None else oh.ReasoningEffort(part.reasoning_effort.value.capitalize())
        return oh.SystemContent(
            model_identity=part.model_identity,
            reasoning_effort=effort,
            knowledge_cutoff=part.knowledge_cutoff,
            conversation_start_date=part.conversation_start_date,
            channel_config=channel_config,
            tools=_namespaces(part.tools),
        )
    assert not part.response_formats, "the reference cannot render response formats"
    return oh.DeveloperContent(instructions=part.instructions, tools=_namespaces(part.tools))


def to_reference(message: types.Message) -> Any:
    oh = harmony_module()
    author = oh.Author(role=oh.Role(message.author.role.value), name=message.author.name)
    ref = oh.Message(author=author, content=[_content(p) for p in message.content])
    ref.channel = message.channel
    ref.recipient = message.recipient
    ref.content_type = message.content_type
    return ref


def reference_render(
    messages: list[types.Message], mode: str = "completion", policy: cot.CotPolicy = cot.CotPolicy.REFERENCE
) -> list[int]:
    oh = harmony_module()
    enc = reference_encoding()
    conversation = oh.Conversation.from_messages([to_reference(m) for m in messages])
    config = oh.RenderConversationConfig(auto_drop_analysis=policy is not cot.CotPolicy.KEEP_ALL)
    if mode == "completion":
        return enc.render_conversation_for_completion(conversation, oh.Role.ASSISTANT, config)
    if mode == "training":
        return enc.render_conversation_for_training(conversation, config)
    return enc.render_conversation(conversation, config)
