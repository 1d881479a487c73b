"""Special tokens of the o200k_harmony encoding, with the reference renderer's ids."""

from __future__ import annotations

STARTOFTEXT = 199998
ENDOFTEXT = 199999
RETURN = 200002
CONSTRAIN = 200003
CHANNEL = 200005
START = 200006
END = 200007
MESSAGE = 200008
CALL = 200012

FIRST_SPECIAL = 199998
LAST_SPECIAL = 201088  # inclusive: the reference reserves 200014..=201088
VOCAB_SIZE = LAST_SPECIAL + 1

_NAMED = {
    STARTOFTEXT: "<|startoftext|>",
    ENDOFTEXT: "<|endoftext|>",
    RETURN: "<|return|>",
    CONSTRAIN: "<|constrain|>",
    CHANNEL: "<|channel|>",
    START: "<|start|>",
    END: "<|end|>",
    MESSAGE: "<|message|>",
    CALL: "<|call|>",
}

SPECIAL_TOKENS: dict[str, int] = {_NAMED.get(i, f"<|reserved_{i}|>"): i for i in range(FIRST_SPECIAL, LAST_SPECIAL + 1)}
SPECIAL_TEXT: dict[int, str] = {i: s for s, i in SPECIAL_TOKENS.items()}

# The model separates its own messages with <|end|>; sampling stops on these two.
STOP_TOKENS_FOR_ASSISTANT_ACTIONS: tuple[int, ...] = (RETURN, CALL)
# Every token that ends a message.
STOP_TOKENS: tuple[int, ...] = (RETURN, END, CALL)


def is_special(token: int) -> bool:
    return FIRST_SPECIAL <= token <= LAST_SPECIAL
