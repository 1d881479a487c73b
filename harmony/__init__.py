"""Harmony prompt format for gpt-oss: encoding, types, renderer, CoT policy, streaming parser."""

from .builtin_tools import browser_namespace, python_namespace
from .cot import CotPolicy, apply_cot_policy
from .encoding import HarmonyEncoding, load_harmony_encoding
from .events import ContentDelta, MessageEnd, MessageStart, ParseEvent, Repair, RepairKind, StopReason
from .parser import ParsedCompletion, StreamParser, parse_completion
from .render import Renderer, RenderError
from .tokens import STOP_TOKENS, STOP_TOKENS_FOR_ASSISTANT_ACTIONS
from .types import (
    Author,
    ChannelConfig,
    Content,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    ResponseFormat,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespace,
)
from .vocab import VocabularyError

__all__ = [
    "STOP_TOKENS",
    "STOP_TOKENS_FOR_ASSISTANT_ACTIONS",
    "Author",
    "ChannelConfig",
    "Content",
    "ContentDelta",
    "Conversation",
    "CotPolicy",
    "DeveloperContent",
    "HarmonyEncoding",
    "Message",
    "MessageEnd",
    "MessageStart",
    "ParseEvent",
    "ParsedCompletion",
    "ReasoningEffort",
    "RenderError",
    "Renderer",
    "Repair",
    "RepairKind",
    "ResponseFormat",
    "Role",
    "StopReason",
    "StreamParser",
    "SystemContent",
    "ToolDescription",
    "ToolNamespace",
    "VocabularyError",
    "apply_cot_policy",
    "browser_namespace",
    "load_harmony_encoding",
    "parse_completion",
    "python_namespace",
]
