"""Checks for a checker process to run in the tests (importable there: tests/support is on its path)."""

from __future__ import annotations


def allocate(body: object, mib: int) -> None:
    """A check that takes `mib` MiB, as a hostile body's parse might."""
    bytearray(mib * 1024 * 1024)


def broken(body: object) -> None:
    """A check with a bug of its own."""
    raise ValueError("not a client's error")
