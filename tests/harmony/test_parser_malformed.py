"""Each malformed-output row of ../shared/notes/harmony.md, with the recovery we chose."""

from __future__ import annotations

import re

import pytest

from harmony import Role
from harmony.events import RepairKind as K
from harmony.events import StopReason
from harmony.parser import parse_completion

A = "assistant"
CJ = "<|constrain|>json"


def m(channel=None, text="", recipient=None, content_type=None, role=A, name=None):
    return (role, name, channel, recipient, content_type, text)


# name: (completion text, role given to the parser, expected messages, repair kinds, final stop)
ROWS = {
    "ok_analysis_then_final": (
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("analysis", "think"), m("final", "Hi")], set(), StopReason.RETURN),
    "ok_tool_call_recipient_in_channel_part": (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"SF"}<|call|>',
        Role.ASSISTANT, [m("commentary", '{"location":"SF"}', "functions.get_weather", CJ)], set(), StopReason.CALL),
    "missing_start_and_role_before_2nd": (
        "<|channel|>analysis<|message|>think<|end|><|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("analysis", "think"), m("final", "Hi")], {K.MISSING_START}, StopReason.RETURN),
    "missing_start_only_before_2nd": (
        "<|channel|>analysis<|message|>think<|end|>assistant<|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("analysis", "think"), m("final", "Hi")], {K.MISSING_START}, StopReason.RETURN),
    "missing_role_after_start": (
        "<|channel|>analysis<|message|>think<|end|><|start|><|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("analysis", "think"), m("final", "Hi")], {K.MISSING_ROLE}, StopReason.RETURN),
    "no_end_before_start": (
        "<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("analysis", "think"), m("final", "Hi")], {K.MISSING_END}, StopReason.RETURN),
    "recipient_in_role_part_2nd_msg": (
        "<|channel|>analysis<|message|>need tool<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary"
        ' <|constrain|>json<|message|>{"location":"SF"}<|call|>',
        Role.ASSISTANT, [m("analysis", "need tool"), m("commentary", '{"location":"SF"}', "functions.get_weather", CJ)],
        set(), StopReason.CALL),
    "recipient_in_role_part_first_msg": (
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"location":"SF"}<|call|>',
        Role.ASSISTANT, [m("commentary", '{"location":"SF"}', "functions.get_weather", "json")], set(), StopReason.CALL),
    "recipient_role_part_constrain_adjacent": (
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary"
        "<|constrain|>json<|message|>{}<|call|>",
        Role.ASSISTANT, [m("analysis", "x"), m("commentary", "{}", "functions.get_weather", CJ)], set(), StopReason.CALL),
    "recipient_channel_part_constrain_adjacent": (
        "<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{}<|call|>",
        Role.ASSISTANT, [m("commentary", "{}", "functions.get_weather", CJ)], set(), StopReason.CALL),
    "recipient_without_to_prefix": (
        "<|channel|>analysis python code<|message|>print(1)<|call|>",
        Role.ASSISTANT, [m("analysis", "print(1)", "python", "code")], {K.RECIPIENT_WITHOUT_TO}, StopReason.CALL),
    "builtin_call_analysis_code": (
        "<|channel|>analysis to=python code<|message|>print(1)<|call|>",
        Role.ASSISTANT, [m("analysis", "print(1)", "python", "code")], set(), StopReason.CALL),
    "constrain_without_recipient": (
        "<|channel|>commentary <|constrain|>json<|message|>{}<|end|>",
        Role.ASSISTANT, [m("commentary", "{}", None, CJ)], {K.CONTENT_TYPE_WITHOUT_RECIPIENT}, StopReason.END),
    "content_type_without_recipient": (
        "<|channel|>commentary json<|message|>{}<|end|>",
        Role.ASSISTANT, [m("commentary", "{}", None, "json")], {K.CONTENT_TYPE_WITHOUT_RECIPIENT}, StopReason.END),
    "constrain_only_no_type": (
        " to=functions.x<|channel|>commentary <|constrain|><|message|>{}<|call|>",
        Role.ASSISTANT, [m("commentary", "{}", "functions.x", "<|constrain|>")], {K.CONSTRAIN_WITHOUT_TYPE}, StopReason.CALL),
    "three_header_words": (
        "<|channel|>commentary to=functions.x json extra<|message|>{}<|call|>",
        Role.ASSISTANT, [m("commentary", "{}", "functions.x", "json")], {K.EXTRA_HEADER_WORDS}, StopReason.CALL),
    "constrain_in_content": (
        "<|channel|>final<|message|>a<|constrain|>b<|return|>",
        Role.ASSISTANT, [m("final", "ab")], {K.SPECIAL_IN_CONTENT}, StopReason.RETURN),
    "unknown_channel": (
        "<|channel|>thoughts<|message|>x<|end|>", Role.ASSISTANT, [m("thoughts", "x")], set(), StopReason.END),
    "empty_channel": (
        "<|channel|><|message|>x<|end|>", Role.ASSISTANT, [m(None, "x")], {K.EMPTY_CHANNEL}, StopReason.END),
    "channel_then_space": (
        "<|channel|> final<|message|>x<|end|>", Role.ASSISTANT, [m("final", "x")], set(), StopReason.END),
    "no_channel": ("<|message|>plain<|end|>", Role.ASSISTANT, [m(None, "plain")], set(), StopReason.END),
    "two_channel_markers": (
        "<|channel|>analysis<|channel|>final<|message|>x<|end|>",
        Role.ASSISTANT, [m("final", "x")], {K.DUPLICATE_CHANNEL}, StopReason.END),
    "text_after_return": (
        "<|channel|>final<|message|>Hi<|return|>extra text",
        Role.ASSISTANT, [m("final", "Hi")], {K.TOKENS_AFTER_RETURN}, StopReason.RETURN),
    "message_after_return": (
        "<|channel|>final<|message|>Hi<|return|><|start|>assistant<|channel|>final<|message|>again<|return|>",
        Role.ASSISTANT, [m("final", "Hi"), m("final", "again")], set(), StopReason.RETURN),
    "double_end": (
        "<|channel|>final<|message|>Hi<|end|><|end|>", Role.ASSISTANT, [m("final", "Hi")], {K.STRAY_STOP}, StopReason.END),
    "end_vs_call_same_message": (
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|end|>",
        Role.ASSISTANT, [m("commentary", "{}", "functions.f", CJ)], set(), StopReason.END),
    "end_then_return": (
        "<|channel|>final<|message|>Hi<|end|><|return|>",
        Role.ASSISTANT, [m("final", "Hi")], {K.STRAY_STOP}, StopReason.RETURN),
    "duplicated_recipient": (
        "<|channel|>commentary to=functions.get_weather to=functions.get_weather<|message|>{}<|call|>",
        Role.ASSISTANT, [m("commentary", "{}", "functions.get_weather")], {K.DUPLICATE_RECIPIENT}, StopReason.CALL),
    "double_start": (
        "<|channel|>analysis<|message|>x<|end|><|start|><|start|>assistant<|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("analysis", "x"), m("final", "Hi")], {K.REDUNDANT_START}, StopReason.RETURN),
    "truncated_mid_content": (
        "<|channel|>analysis<|message|>Hello wor", Role.ASSISTANT, [m("analysis", "Hello wor")], set(), StopReason.EOS),
    "truncated_mid_header": ("<|channel|>fin", Role.ASSISTANT, [], {K.TRUNCATED_HEADER}, None),
    "truncated_after_start_role": (
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant",
        Role.ASSISTANT, [m("analysis", "x")], {K.TRUNCATED_HEADER}, StopReason.END),
    "truncated_after_end": (
        "<|channel|>analysis<|message|>x<|end|>", Role.ASSISTANT, [m("analysis", "x")], set(), StopReason.END),
    "truncated_after_message_token": (
        "<|channel|>final<|message|>", Role.ASSISTANT, [m("final", "")], set(), StopReason.EOS),
    "missing_message_token_first": (
        "<|channel|>commentary Hello<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>",
        Role.ASSISTANT, [m("commentary", "Hello"), m("final", "ok")], {K.MISSING_MESSAGE_TOKEN}, StopReason.RETURN),
    "missing_message_token_second": (
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final Hello<|return|>",
        Role.ASSISTANT, [m("analysis", "x"), m("final", "Hello")], {K.MISSING_MESSAGE_TOKEN}, StopReason.RETURN),
    "missing_message_token_whitespace": (
        "assistant I must\n\nrefuse  now<|end|>",
        Role.ASSISTANT, [m(None, "I must\n\nrefuse  now")], {K.MISSING_MESSAGE_TOKEN}, StopReason.END),
    "missing_message_token_no_channel_first": (
        "I must refuse<|end|><|start|>assistant<|channel|>final<|message|>Sorry<|return|>",
        Role.ASSISTANT, [m(None, "I must refuse"), m("final", "Sorry")], {K.MISSING_MESSAGE_TOKEN}, StopReason.RETURN),
    "utf8_emoji_split_ok": (
        "<|channel|>final<|message|>💖<|return|>", Role.ASSISTANT, [m("final", "💖")], set(), StopReason.RETURN),
    "invalid_token_id_in_content": (
        "<|channel|>final<|message|>abc<|id300000|>def<|end|>",
        Role.ASSISTANT, [m("final", "abcdef")], {K.UNKNOWN_TOKEN}, StopReason.END),
    "reserved_token_in_content": (
        "<|channel|>final<|message|>a<|reserved_200013|>b<|end|>",
        Role.ASSISTANT, [m("final", "ab")], {K.SPECIAL_IN_CONTENT}, StopReason.END),
    "role_none_ok": (
        "<|start|>assistant<|channel|>final<|message|>Hi<|return|>", None, [m("final", "Hi")], set(), StopReason.RETURN),
    "role_none_missing_start": (
        "<|channel|>final<|message|>Hi<|return|>", None, [m("final", "Hi")], {K.MISSING_START}, StopReason.RETURN),
    "role_none_tool_msg_without_recipient": (
        "<|start|>functions.get_weather<|message|>{}<|end|>",
        None, [m(None, "{}", role="tool", name="functions.get_weather")], set(), StopReason.END),
    "role_none_tool_msg_with_recipient": (
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{}<|end|>",
        None, [m("commentary", "{}", "assistant", role="tool", name="functions.get_weather")], set(), StopReason.END),
    "role_none_user_name": (
        "<|start|>user:alice<|message|>hi<|end|>", None, [m(None, "hi", role="user", name="alice")], set(), StopReason.END),
    "role_given_and_header_repeats_role": (
        "<|start|>assistant<|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("final", "Hi")], {K.REDUNDANT_START}, StopReason.RETURN),
    "role_given_header_repeats_role_no_start": (
        "assistant<|channel|>final<|message|>Hi<|return|>", Role.ASSISTANT, [m("final", "Hi")], set(), StopReason.RETURN),
    # beyond the table
    "endoftext_ends_like_return": (
        "<|channel|>final<|message|>Hi<|endoftext|>",
        Role.ASSISTANT, [m("final", "Hi")], {K.ENDOFTEXT_AS_RETURN}, StopReason.RETURN),
    "message_token_without_header": (
        "<|channel|>analysis<|message|>x<|end|><|message|>y<|end|>",
        Role.ASSISTANT, [m("analysis", "x"), m(None, "y")], {K.MISSING_START}, StopReason.END),
    "unknown_id_in_header": (
        "<|channel|>fi<|id300001|>nal<|message|>x<|end|>",
        Role.ASSISTANT, [m("final", "x")], {K.UNKNOWN_TOKEN}, StopReason.END),
    "reserved_token_in_header": (
        "<|channel|>final<|reserved_200013|><|message|>x<|end|>",
        Role.ASSISTANT, [m("final", "x")], {K.SPECIAL_IN_HEADER}, StopReason.END),
    "channel_inside_content_starts_a_message": (
        "<|channel|>analysis<|message|>x<|channel|>final<|message|>Hi<|return|>",
        Role.ASSISTANT, [m("analysis", "x"), m("final", "Hi")], {K.MISSING_END}, StopReason.RETURN),
    "missing_message_token_in_tool_call": (
        '<|channel|>commentary to=functions.f <|constrain|>json {"a": 1}<|call|>',
        Role.ASSISTANT, [m("commentary", '{"a": 1}', "functions.f", CJ)], {K.MISSING_MESSAGE_TOKEN}, StopReason.CALL),
    "stop_in_header_at_eos_with_text": (
        "I must refuse", Role.ASSISTANT, [m(None, "I must refuse")], {K.MISSING_MESSAGE_TOKEN}, StopReason.EOS),
}  # fmt: skip


def tokens_of(tok, text: str) -> list[int]:
    """Like `tok`, plus `<|idN|>` for an arbitrary (out-of-vocabulary) id."""
    out: list[int] = []
    for i, piece in enumerate(re.split(r"<\|id(\d+)\|>", text)):
        out += [int(piece)] if i % 2 else tok(piece)
    return out


@pytest.mark.parametrize("name", sorted(ROWS))
def test_malformed_row(tok, name):
    text, role, expected, repairs, stop = ROWS[name]
    parsed = parse_completion(tokens_of(tok, text), role)
    got = [
        (msg.role.value, msg.author.name, msg.channel, msg.recipient, msg.content_type, msg.text)
        for msg in parsed.messages
    ]
    assert got == expected
    assert {r.kind for r in parsed.repairs} == repairs
    assert parsed.stop == stop


def _byte_token(encoding, byte: int) -> int:
    return encoding.token_bytes.index(bytes([byte]))


def test_utf8_split_and_truncated(encoding, tok):
    heart = "💖".encode()
    pieces = [_byte_token(encoding, b) for b in heart]
    head = tok("<|channel|>final<|message|>ok")
    # a character split over four tokens arrives whole
    whole = parse_completion([*head, *pieces, *tok("<|return|>")])
    assert whole.messages[0].text == "ok💖" and not whole.repairs
    # cut by the end of the stream or by a stop token: one replacement character, no exception
    assert parse_completion([*head, *pieces[:2]]).messages[0].text == "ok\ufffd"
    cut = parse_completion([*head, *pieces[:2], *tok("<|end|>")])
    assert cut.messages[0].text == "ok\ufffd" and cut.stop is StopReason.END
    # bytes in the wrong order decode to replacement characters only
    reversed_text = parse_completion([*head, *reversed(pieces), *tok("<|end|>")]).messages[0].text
    assert reversed_text.startswith("ok") and set(reversed_text[2:]) == {"\ufffd"}
    # stray continuation bytes inside text
    stray = parse_completion([*head, _byte_token(encoding, 0x80), *tok(" worked<|end|>")])
    assert stray.messages[0].text == "ok\ufffd worked"


def test_invalid_utf8_in_header_is_dropped_and_reported(encoding, tok):
    tokens = [
        *tok(" to=functions.get_weather "),
        _byte_token(encoding, 0xFF),
        *tok("<|channel|>commentary<|message|>{}<|call|>"),
    ]
    parsed = parse_completion(tokens)
    assert [(m.recipient, m.channel, m.content_type, m.text) for m in parsed.messages] == [
        ("functions.get_weather", "commentary", None, "{}")
    ]
    assert {r.kind for r in parsed.repairs} == {K.INVALID_UTF8_IN_HEADER}


def test_header_without_message_token_is_bounded(tok):
    from harmony.parser import MAX_HEADER_TOKENS

    words = " ".join(f"w{i}" for i in range(MAX_HEADER_TOKENS))
    parsed = parse_completion(tok(f"<|channel|>final {words} and more<|return|>"))
    assert parsed.messages[0].channel == "final"
    assert parsed.messages[0].text.startswith("w0 w1") and parsed.messages[0].text.endswith("and more")
    assert K.HEADER_TOO_LONG in {r.kind for r in parsed.repairs}


def test_a_tool_call_header_without_to_keeps_its_recipient(tok):
    parsed = parse_completion(tok('<|channel|>commentary functions.get_weather<|message|>{"city":"Paris"}<|call|>'))
    (message,) = parsed.messages
    assert message.recipient == "functions.get_weather" and message.channel == "commentary"
    assert message.content_type is None and parsed.stop is StopReason.CALL
    assert [r.kind for r in parsed.repairs] == [K.RECIPIENT_WITHOUT_TO]
    typed = parse_completion(tok("<|channel|>commentary functions.f <|constrain|>json<|message|>{}<|call|>"))
    assert typed.messages[0].recipient == "functions.f" and typed.messages[0].content_type == "<|constrain|>json"


def test_a_header_word_holding_a_literal_replacement_character_is_reported(tok):
    parsed = parse_completion(tok("<|channel|>final \ufffdjunk<|message|>hi<|return|>"))
    assert parsed.messages[0].channel == "final" and parsed.messages[0].text == "hi"
    assert [r.kind for r in parsed.repairs] == [K.INVALID_UTF8_IN_HEADER]


def test_output_after_each_return_is_reported(tok):
    text = "<|channel|>final<|message|>a<|return|>stray<|start|>assistant<|channel|>final<|message|>b<|return|>more"
    parsed = parse_completion(tok(text))
    assert [m.text for m in parsed.messages] == ["a", "b"]
    assert [r.kind for r in parsed.repairs].count(K.TOKENS_AFTER_RETURN) == 2


def test_a_role_word_in_continued_output_does_not_change_the_author(tok):
    parsed = parse_completion(tok("user<|channel|>final<|message|>obey me<|return|>"))
    assert parsed.messages[0].author.role is Role.ASSISTANT
    assert [r.kind for r in parsed.repairs] == [K.ROLE_IN_OUTPUT_HEADER]
    same = parse_completion(tok("assistant<|channel|>final<|message|>fine<|return|>"))
    assert same.messages[0].author.role is Role.ASSISTANT and same.repairs == []


def test_a_byte_cached_as_a_whole_token_still_completes_a_character(encoding, tok):
    """Text tokens whose bytes are whole UTF-8 are decoded once per encoding; a byte met alone (a replacement
    character) is still a character's continuation when a lead byte is held."""
    heart = "💖".encode()
    pieces = [_byte_token(encoding, b) for b in heart]
    head = tok("<|channel|>final<|message|>")
    alone = parse_completion([*head, pieces[1], *tok("<|end|>")], encoding=encoding)
    assert alone.messages[0].text == "\ufffd" and encoding.whole_texts[pieces[1]] == "\ufffd"
    after_lead = parse_completion([*head, *pieces, pieces[1], *tok(" ok<|end|>")], encoding=encoding)
    assert after_lead.messages[0].text == "💖\ufffd ok"
    assert pieces[0] not in encoding.whole_texts  # a lead byte alone is held back, never cached
