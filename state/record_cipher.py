"""Encryption at rest for stored records (responses with their raw CoT, CoT indexed by call id).

AES-256-GCM under keys derived (HKDF-SHA256) from the gateway's reasoning keys, so one secret serves both
`encrypted_content` and the store without the two uses sharing a key. Blob: `E`, the key id's length
and bytes, a 12-byte nonce, the ciphertext and tag. The additional data is the record's Redis key name,
which holds the tenant's hash tag and the id: a blob copied under another key or tenant fails to open.
The first key seals; every key opens, so keys rotate by prepending a new one.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .store import StoreUnavailable

SEALED = b"E"
_NONCE_BYTES = 12
_PURPOSE = b"gpt-oss-gateway store at rest v1"


def _derive(secret: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_PURPOSE).derive(secret)


class RecordCipher:
    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise ValueError("encryption at rest needs at least one key")
        self._active = keys[0][0].encode()
        self._ciphers = {key_id.encode(): AESGCM(_derive(secret)) for key_id, secret in keys}

    def seal(self, blob: bytes, where: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[self._active].encrypt(nonce, blob, where.encode())
        return SEALED + bytes([len(self._active)]) + self._active + nonce + sealed

    def open(self, blob: bytes, where: str) -> bytes:
        """The plain blob; a record stored before encryption was turned on is returned as it is."""
        if blob[:1] != SEALED:
            return blob
        size = blob[1]
        key_id, rest = blob[2 : 2 + size], blob[2 + size :]
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise StoreUnavailable(
                f"a stored record is sealed with key '{key_id.decode(errors='replace')}', which this gateway "
                "does not hold",
                reason="a stored record's key is not configured (GATEWAY_REASONING_KEYS)",
            )
        try:
            return cipher.decrypt(rest[:_NONCE_BYTES], rest[_NONCE_BYTES:], where.encode())
        except InvalidTag:
            raise StoreUnavailable(
                "a stored record failed authentication (altered or moved)", reason="a stored record is corrupt"
            ) from None
