"""Conversation → prompt token ids. Special tokens are emitted as ids; every text piece is
encoded on its own as ordinary text, so text typed by users never becomes a special token."""

from __future__ import annotations

from .cot import CotPolicy, apply_cot_policy
from .encoding import HarmonyEncoding, load_harmony_encoding
from .prompt_text import clear_tool_texts, developer_sections, has_function_tools, system_sections, token_pieces
from .tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from .types import Conversation, DeveloperContent, Message, Role, SystemContent

CONSTRAIN_TEXT = "<|constrain|>"
_CACHE_LIMIT = 4096
_CACHED_TEXT_LIMIT = 64 * 1024


class RenderError(ValueError):
    """The conversation cannot be rendered (e.g. a tool message without a name)."""


def _messages(conversation: Conversation | list[Message]) -> list[Message]:
    return conversation.messages if isinstance(conversation, Conversation) else conversation


class Renderer:
    """Renders Harmony messages; repeated pieces (headers, system and developer texts) are cached.

    An assistant message's recipient goes in the role part of its header, as openai-harmony renders it,
    or with `recipient_in_channel` after its channel, as the model writes it
    (`<|channel|>commentary to=functions.x <|constrain|>json`): then a prompt that repeats the model's
    calls repeats its tokens too, and a prefix cache finds them."""

    def __init__(self, encoding: HarmonyEncoding | None = None, recipient_in_channel: bool = False) -> None:
        self.encoding = encoding or load_harmony_encoding()
        self.recipient_in_channel = recipient_in_channel
        self._encode = self.encoding.encode_ordinary
        self._cache: dict[str, list[int]] = {}

    def clear_cache(self) -> None:
        self._cache.clear()
        clear_tool_texts()

    def _cached(self, text: str) -> list[int]:
        tokens = self._cache.get(text)
        if tokens is None:
            tokens = self._encode(text)
            if len(text) <= _CACHED_TEXT_LIMIT:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[text] = tokens
        return tokens

    def render_message_into(self, message: Message, out: list[int], function_tools: bool = False) -> None:
        cached = self._cached
        role = message.author.role
        name = message.author.name
        out.append(START)
        if role is Role.TOOL:
            if name is None:
                raise RenderError("Tools should have a name!")
            out += cached(name)
        else:
            out += cached(role.value)
            if name is not None:
                out += cached(":" + name)
        recipient = message.recipient
        addressed = recipient is not None and recipient != "all"
        after_channel = (
            addressed and self.recipient_in_channel and role is Role.ASSISTANT and message.channel is not None
        )
        if addressed and not after_channel:
            out += cached(" to=" + recipient)
        if message.channel is not None:
            out.append(CHANNEL)
            out += cached(message.channel)
            if after_channel:
                out += cached(" to=" + recipient)
        content_type = message.content_type
        if content_type is not None:
            if content_type.startswith(CONSTRAIN_TEXT):
                out += cached(" ")
                out.append(CONSTRAIN)
                rest = content_type[len(CONSTRAIN_TEXT) :]
                if rest:
                    out += cached(rest)
            else:
                out += cached(" " + content_type)
        out.append(MESSAGE)
        for part in message.content:
            if isinstance(part, str):
                out += self._encode(part)
                continue
            if isinstance(part, SystemContent):
                if role is not Role.SYSTEM:
                    raise RenderError(f"SystemContent may only appear in system messages, found in {role.value}")
                sections = system_sections(part, function_tools)
            elif isinstance(part, DeveloperContent):
                if role is not Role.DEVELOPER:
                    raise RenderError(f"DeveloperContent may only appear in developer messages, found in {role.value}")
                sections = developer_sections(part)
            else:
                raise RenderError(f"unsupported content part {type(part).__name__}")
            for piece in token_pieces(sections):  # each section's tokens cached on their own
                out += cached(piece)
        out.append(CALL if role is Role.ASSISTANT and recipient is not None else END)

    def render_message(self, message: Message, function_tools: bool = False) -> list[int]:
        out: list[int] = []
        self.render_message_into(message, out, function_tools)
        return out

    def render_conversation(
        self, conversation: Conversation | list[Message], cot: CotPolicy = CotPolicy.SEEDS
    ) -> list[int]:
        messages = _messages(conversation)
        function_tools = has_function_tools(messages)
        out: list[int] = []
        for message in apply_cot_policy(messages, cot):
            self.render_message_into(message, out, function_tools)
        return out

    def render_for_completion(
        self,
        conversation: Conversation | list[Message],
        next_role: Role = Role.ASSISTANT,
        cot: CotPolicy = CotPolicy.SEEDS,
    ) -> list[int]:
        """The prompt: the conversation, then `<|start|>{role}` for the model to continue."""
        out = self.render_conversation(conversation, cot)
        out.append(START)
        out += self._cached(next_role.value)
        return out

    def render_for_training(
        self, conversation: Conversation | list[Message], cot: CotPolicy = CotPolicy.SEEDS
    ) -> list[int]:
        """As the conversation, but a trailing final answer ends with `<|return|>`."""
        messages = _messages(conversation)
        out = self.render_conversation(messages, cot)
        if messages and messages[-1].author.role is Role.ASSISTANT and messages[-1].channel == "final":
            out[-1] = RETURN
        return out
