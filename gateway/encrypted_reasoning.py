"""`encrypted_content` for reasoning items: AES-256-GCM with a key id, bound to the tenant.

Blob: `gwr1.<key id>.<base64url(nonce ‖ ciphertext ‖ tag)>`. The additional data binds the blob to the
tenant and key id, so another tenant's blob, a tampered one or one sealed by an unknown key fails to open.
Keys come from `GATEWAY_REASONING_KEYS` (`id:base64key,...`, the first one seals, all of them open), so
replicas share them and keys rotate by prepending a new one.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = "gwr1"
_NONCE_BYTES = 12


class SealError(ValueError):
    """A blob that this gateway did not seal for this tenant, or that was altered."""


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_keys(spec: str) -> list[tuple[str, bytes]]:
    """`id:base64key,...` → [(id, 32-byte key)]; raises ValueError with the offending entry."""
    keys = []
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        key_id, sep, encoded = entry.partition(":")
        if not sep or not key_id.isalnum():
            raise ValueError(f"reasoning key entry '{key_id}...' must be 'id:base64key' with an alphanumeric id")
        try:
            key = _b64decode(encoded.replace("+", "-").replace("/", "_"))
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"reasoning key '{key_id}' is not base64") from exc
        if len(key) != 32:
            raise ValueError(f"reasoning key '{key_id}' must be 32 bytes, got {len(key)}")
        keys.append((key_id, key))
    if not keys:
        raise ValueError("no reasoning keys given")
    return keys


class ReasoningSealer:
    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        self._active_id = keys[0][0]
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys}

    @classmethod
    def ephemeral(cls) -> ReasoningSealer:
        """A random key for this process only (blobs do not survive a restart or cross replicas)."""
        return cls([("e" + secrets.token_hex(4), AESGCM.generate_key(bit_length=256))])

    @staticmethod
    def _aad(key_id: str, tenant: str, purpose: str) -> bytes:
        return f"{VERSION}|{key_id}|{tenant}{'|' + purpose if purpose else ''}".encode()

    def seal(self, tenant: str, text: str, purpose: str = "") -> str:
        """`purpose`: "" for reasoning (blobs issued before purposes existed still open), else its name."""
        nonce = os.urandom(_NONCE_BYTES)
        aad = self._aad(self._active_id, tenant, purpose)
        sealed = self._ciphers[self._active_id].encrypt(nonce, text.encode(), aad)
        body = base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode()
        return f"{VERSION}.{self._active_id}.{body}"

    def open(self, tenant: str, blob: str, purpose: str = "") -> str:
        version, _, rest = blob.partition(".")
        key_id, _, body = rest.partition(".")
        if version != VERSION or not body:
            raise SealError("not an encrypted_content blob issued by this gateway")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise SealError(f"encrypted_content was sealed with key '{key_id}', which this gateway does not hold")
        try:
            raw = _b64decode(body)
            plain = cipher.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], self._aad(key_id, tenant, purpose))
            return plain.decode()
        except (binascii.Error, ValueError, InvalidTag, UnicodeDecodeError) as exc:
            raise SealError("encrypted_content failed authentication (altered, truncated or another tenant's)") from exc
