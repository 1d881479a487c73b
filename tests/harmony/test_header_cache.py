"""Headers are parsed once each; a repaired header is parsed, and its repair reported, every time."""

from __future__ import annotations

from harmony import Role, load_harmony_encoding
from harmony import header as header_module
from harmony.events import RepairKind
from harmony.header import HeaderCache
from harmony.parser import parse_completion

CLEAN = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi.<|return|>"
REPAIRED = "<|channel|>commentary functions.get_weather json<|message|>{}<|call|>"  # no to=: read as the recipient


def test_a_header_is_read_the_same_from_the_cache(encoding, tok):
    first = parse_completion(tok(CLEAN), role=Role.ASSISTANT, encoding=encoding)
    again = parse_completion(tok(CLEAN), role=Role.ASSISTANT, encoding=encoding)
    assert [(m.channel, m.text) for m in again.messages] == [("analysis", "Think."), ("final", "Hi.")]
    assert again.messages == first.messages and again.repairs == first.repairs == []


def test_a_repaired_header_reports_its_repair_every_time(encoding, tok):
    for _ in range(3):
        parsed = parse_completion(tok(REPAIRED), role=Role.ASSISTANT, encoding=encoding)
        assert [repair.kind for repair in parsed.repairs] == [RepairKind.RECIPIENT_WITHOUT_TO]
        assert parsed.messages[0].recipient == "functions.get_weather"


def test_the_cache_keeps_at_most_its_limit(monkeypatch, tok):
    monkeypatch.setattr(header_module, "HEADER_CACHE_LIMIT", 3)
    cache = HeaderCache(load_harmony_encoding().token_bytes)
    headers = [tok(f"assistant<|channel|>commentary to=functions.f{index}") for index in range(6)]
    parsed = [cache.parse(h, explicit_start=True, default_role=Role.ASSISTANT) for h in headers]
    assert [fields.recipient for fields in parsed] == [f"functions.f{index}" for index in range(6)]
    assert len(cache._parsed) == 3
    assert cache.parse(headers[0], explicit_start=True, default_role=Role.ASSISTANT) is parsed[0]  # kept
    assert cache.parse(headers[5], explicit_start=True, default_role=Role.ASSISTANT) is not parsed[5]  # parsed again
