"""Logprobs never change or lose the output: over token streams of every shape (well-formed, truncated,
header-only, over-long headers, tool calls, several channels, hostile tokens), fed in any chunking, the output
assembler gives the same items, texts and statuses with and without logprobs, and each answer's logprob tokens
make up exactly its text (their bytes, where the text is valid UTF-8: undecodable bytes become U+FFFD in the
run, header or content, they were read in)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import special_heavy_tokens, texts

from backends.base import TokenLogprob
from gateway.generation.assembler import CallRouting, Delta, Opened, OutputAssembler
from harmony import load_harmony_encoding
from harmony.tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START

ENCODING = load_harmony_encoding()
words = ENCODING.encode_ordinary
PIECES = [
    [CHANNEL, *words("final"), MESSAGE],  # a well-formed answer's header
    [CHANNEL, *words("analysis"), MESSAGE],
    [CHANNEL, *words("commentary"), MESSAGE],  # a preamble
    [CHANNEL, *words("commentary to=functions.get_weather "), CONSTRAIN, *words("json"), MESSAGE],
    [START, *words("assistant")],
    [END],
    [RETURN],
    [CALL],
    [CHANNEL, *words("final")],  # a header that never reaches <|message|>
    words(" final answer without a message token"),
    words(" word") * 70,  # past the parser's header limit: read as text
    words("é中🙂"),
    [ENCODING.token_bytes.index(bytes([byte])) for byte in "é🙂".encode()],  # characters split across tokens
]
streams = st.lists(
    st.one_of(st.sampled_from(PIECES), texts.map(words), special_heavy_tokens.map(lambda ts: ts[:6])), max_size=14
).map(lambda parts: [token for part in parts for token in part])


def _scored(token: int) -> TokenLogprob:
    return TokenLogprob(-(token % 97) / 10, ((token, -(token % 97) / 10), (7, -9.5)))


def _assemble(tokens: list[int], chunks: list[int], top: int | None, deltas: bool = True):
    assembler = OutputAssembler(ENCODING, CallRouting(), top, deltas)
    events, start = [], 0
    for size in [*chunks, len(tokens)]:
        part = tokens[start : start + size]
        start += size
        if part:
            events += assembler.feed(part, [_scored(t) for t in part] if top is not None else None)
    events += assembler.finish()
    return assembler, events


def _shape(assembler: OutputAssembler) -> list[tuple]:
    return [
        (item.kind, item.text, item.done, item.complete, item.channel, item.preamble, item.name, item.namespace)
        for item in assembler.items
    ]


@settings(max_examples=300, deadline=None)
@given(streams, st.lists(st.integers(min_value=1, max_value=9), max_size=30))
def test_output_is_the_same_with_logprobs_and_they_make_up_the_answer(tokens, chunks):
    plain, plain_events = _assemble(tokens, chunks, None)
    scored, scored_events = _assemble(tokens, chunks, 2)
    assert _shape(scored) == _shape(plain)
    assert [type(e).__name__ for e in scored_events] == [type(e).__name__ for e in plain_events]
    assert (scored.output_tokens, scored.reasoning_tokens) == (plain.output_tokens, plain.reasoning_tokens)
    for item in scored.items:
        if item.kind != "message" or item.preamble:
            assert item.logprobs is None
            continue
        joined = b"".join(bytes(entry["bytes"]) for entry in item.logprobs)
        if "\ufffd" not in item.text:  # undecodable bytes are replaced per run (header, content) as they are read
            assert joined.decode("utf-8") == item.text
        streamed = [entry for e in scored_events if isinstance(e, Delta) and e.item is item for entry in e.logprobs]
        assert streamed == item.logprobs[: len(streamed)]  # each delta carries the tokens its text came from


def test_a_header_read_as_text_carries_its_tokens_logprobs():
    """No <|message|> and no channel: the parser reads the header as the answer; its tokens are scored."""
    tokens = [*words("The answer is forty-two."), RETURN]
    assembler, _ = _assemble(tokens, [], 0)
    (item,) = assembler.items
    assert item.text == "The answer is forty-two." and item.kind == "message"
    assert "".join(entry["token"] for entry in item.logprobs) == item.text


def test_a_header_past_the_limit_keeps_every_word_with_logprobs():
    tokens = [CHANNEL, *words("final"), *words(" word") * 80, RETURN]
    plain, _ = _assemble(tokens, [], None)
    scored, _ = _assemble(tokens, [5], 1)
    assert scored.items[0].text == plain.items[0].text == "word" + " word" * 79
    assert "".join(entry["token"] for entry in scored.items[0].logprobs) == scored.items[0].text


def _content(event) -> bool:
    """Answer text or a call: what the time to first content token waits for."""
    if isinstance(event, Delta):
        return event.item.kind != "reasoning"
    return isinstance(event, Opened) and (event.item.is_call or event.item.is_hosted)


@settings(max_examples=200, deadline=None)
@given(streams, st.lists(st.integers(min_value=1, max_value=9), max_size=30), st.sampled_from([None, 2]))
def test_without_deltas_the_output_is_the_same_and_content_is_still_counted(tokens, chunks, top):
    """A response nobody streams is assembled without Delta events (its text joins its items alone): the same
    items, logprobs, counts and other events, and the same count of content events."""
    streamed, streamed_events = _assemble(tokens, chunks, top)
    quiet, quiet_events = _assemble(tokens, chunks, top, deltas=False)
    assert _shape(quiet) == _shape(streamed)
    assert [item.logprobs for item in quiet.items] == [item.logprobs for item in streamed.items]
    assert [entry.message for entry in quiet.entries] == [entry.message for entry in streamed.entries]
    assert (quiet.output_tokens, quiet.reasoning_tokens) == (streamed.output_tokens, streamed.reasoning_tokens)
    assert not any(isinstance(event, Delta) for event in quiet_events)
    others = [event for event in streamed_events if not isinstance(event, Delta)]
    assert [(type(e), e.item.index) for e in quiet_events] == [(type(e), e.item.index) for e in others]
    assert quiet.content_events == streamed.content_events == sum(map(_content, streamed_events))
