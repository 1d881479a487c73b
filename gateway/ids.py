"""Object ids (`resp_…`, `msg_…`, `call_…`): 24 random bytes from the OS's CSPRNG, hex-encoded. The bytes
come from one os.urandom call per 170 ids rather than one per id: a system call is several microseconds
in a VM, and a response makes several ids."""

from __future__ import annotations

import os
import threading

ID_BYTES = 24
_BATCH = ID_BYTES * 170


class _RandomPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # ids are made on the event loop and in render threads
        self._bytes = b""
        self._at = 0

    def take(self) -> bytes:
        with self._lock:
            if self._at + ID_BYTES > len(self._bytes):
                self._bytes, self._at = os.urandom(_BATCH), 0
            start = self._at
            self._at = start + ID_BYTES
            return self._bytes[start : start + ID_BYTES]


_POOL = _RandomPool()


def new_id(prefix: str) -> str:
    return prefix + _POOL.take().hex()


def _reseed_after_fork() -> None:
    """A forked child must not hand out the ids its parent's pool still holds."""
    global _POOL
    _POOL = _RandomPool()


os.register_at_fork(after_in_child=_reseed_after_fork)
