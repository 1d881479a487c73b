"""Harmony prompt format for gpt-oss: encoding, types, renderer, CoT policy, streaming parser."""

from .builtin_tools import browser_namespace, python_namespace
from .cot import CotPolicy, apply_cot_policy
from .encoding import HarmonyEncoding, load_harmony_encoding
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
    "Conversation",
    "CotPolicy",
    "DeveloperContent",
    "HarmonyEncoding",
    "Message",
    "ReasoningEffort",
    "RenderError",
    "Renderer",
    "ResponseFormat",
    "Role",
    "SystemContent",
    "ToolDescription",
    "ToolNamespace",
    "VocabularyError",
    "apply_cot_policy",
    "browser_namespace",
    "load_harmony_encoding",
    "python_namespace",
]
