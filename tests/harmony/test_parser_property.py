"""Parser properties: render → parse round trip, whole-character deltas, no exception on any input."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from strategies import special_heavy_tokens, texts

from harmony import CotPolicy, Message, Role
from harmony.events import ContentDelta, MessageEnd, MessageStart, Repair
from harmony.parser import StreamParser, parse_completion

ROLE_NAMES = {r.value for r in Role}
header_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.-0123456789", min_size=1, max_size=12).filter(
    lambda w: w not in ROLE_NAMES
)
content_types = st.none() | st.sampled_from(["json", "<|constrain|>json", "code"])


def _message(role: Role):
    name = header_words if role is Role.TOOL else st.none() | header_words
    return st.builds(
        lambda n, parts, ch, r, ct: Message.of(role, parts, name=n, channel=ch, recipient=r, content_type=ct),
        name,
        st.lists(texts, min_size=1, max_size=3),
        st.none() | header_words,
        st.none() | header_words.map(lambda w: f"functions.{w}"),
        content_types,
    )


messages = st.lists(st.one_of(*(_message(r) for r in (Role.USER, Role.ASSISTANT, Role.TOOL))), max_size=6)


def _fields(message: Message) -> tuple:
    return (message.role, message.author.name, message.channel, message.recipient, message.content_type, message.text)


@given(messages)
def test_render_then_parse_gives_the_same_messages(renderer, conversation):
    tokens = renderer.render_conversation(conversation, cot=CotPolicy.KEEP_ALL)
    parsed = parse_completion(tokens, role=None, encoding=renderer.encoding)
    assert [_fields(m) for m in parsed.messages] == [_fields(m) for m in conversation]
    repairs = {r.kind.value for r in parsed.repairs}
    assert repairs <= {"content_type_without_recipient"}


@given(st.lists(texts, min_size=1, max_size=4))
def test_streamed_deltas_are_whole_characters(renderer, parts):
    encoding = renderer.encoding
    text = "".join(parts)
    # encode byte-split pieces too: each UTF-8 byte of the text as its own token
    byte_tokens = [encoding.token_bytes.index(bytes([b])) for b in text.encode()]
    for body in (encoding.encode_ordinary(text), byte_tokens):
        parser = StreamParser(encoding)
        deltas = []
        for token in _header(renderer) + body:
            for event in parser.feed(token):
                if isinstance(event, ContentDelta):
                    deltas.append(event.text)
        parser.finish()
        assert "".join(deltas) == text
        if "\ufffd" not in text:
            assert all("\ufffd" not in d for d in deltas)


def _header(renderer) -> list[int]:
    from harmony.tokens import CHANNEL, MESSAGE

    return [CHANNEL, *renderer.encoding.encode_ordinary("final"), MESSAGE]


@given(special_heavy_tokens, st.sampled_from([Role.ASSISTANT, None]))
def test_any_token_sequence_parses_without_exception_and_events_are_consistent(encoding, tokens, role):
    parser = StreamParser(encoding, role)
    events = []
    for token in tokens:
        events += parser.feed(token)
    events += parser.finish()
    open_text: list[str] | None = None
    ended = []
    for event in events:
        if isinstance(event, MessageStart):
            assert open_text is None
            open_text = []
        elif isinstance(event, ContentDelta):
            assert open_text is not None
            open_text.append(event.text)
        elif isinstance(event, MessageEnd):
            assert open_text is not None
            assert event.message.text == "".join(open_text)
            ended.append(event.message)
            open_text = None
        else:
            assert isinstance(event, Repair)
    assert open_text is None
    assert ended == parser.messages
