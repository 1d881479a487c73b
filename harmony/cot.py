"""Which chain of thought (analysis-channel messages) goes back into a prompt.

SEEDS (the default, from the Harmony format guide): the CoT of a turn that ended with a `final`
answer is dropped; the CoT of the turn in progress (the assistant's tool loop since the last final
answer) is kept so the model continues its reasoning after tool results. Formally: drop every
analysis message that precedes the last assistant `final` message.

REFERENCE (openai-harmony 0.0.8, for comparison): only when the last assistant message is `final`,
drop analysis messages before the *first* `final` message of any role. It keeps the CoT of the
second and later completed turns, and keeps everything while a tool loop is in progress.

KEEP_ALL: drop nothing (what the reference does when auto_drop_analysis is off).
"""

from __future__ import annotations

from enum import StrEnum

from .types import Message, Role

ANALYSIS = "analysis"
FINAL = "final"


class CotPolicy(StrEnum):
    SEEDS = "seeds"
    REFERENCE = "reference"
    KEEP_ALL = "keep_all"


def _dropped_before(messages: list[Message], policy: CotPolicy) -> int:
    """Analysis messages with an index below the returned one are dropped."""
    if policy is CotPolicy.SEEDS:
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.author.role is Role.ASSISTANT and message.channel == FINAL:
                return index
        return 0
    if policy is CotPolicy.REFERENCE:
        last_assistant = next((m for m in reversed(messages) if m.author.role is Role.ASSISTANT), None)
        if last_assistant is None or last_assistant.channel != FINAL:
            return 0
        return next(i for i, m in enumerate(messages) if m.channel == FINAL)
    return 0


def apply_cot_policy(messages: list[Message], policy: CotPolicy = CotPolicy.SEEDS) -> list[Message]:
    """The messages that a prompt should contain under the policy."""
    limit = _dropped_before(messages, policy)
    if limit == 0:
        return messages
    return [m for i, m in enumerate(messages) if i >= limit or m.channel != ANALYSIS]
