"""Sandbox numbers unique on the host: each live sandbox holds an exclusive lock on `<n>.lock` in a directory the
replicas of one uid share, so no two sandboxes (of one replica or of several) ever share a number, and with it
a uid (as root), a cgroup or a fallback directory. A crashed replica's locks go with its process; what it left
under its numbers is reclaimed by the next holder."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path


class LeaseDirectoryUnsafe(Exception):
    pass


@dataclass(slots=True)
class Lease:
    number: int
    _fd: int

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Leases:
    def __init__(self, count: int, directory: Path | None = None) -> None:
        self.count = count
        self.directory = directory or Path(tempfile.gettempdir()) / f"gpt-oss-sandboxes-{os.getuid()}"

    def prepare(self) -> None:
        """The directory, this uid's alone: made 0711 (sandbox uids may pass through to their own directories,
        not list it); refused when it is a link or another user's."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.directory, 0o711)
        info = os.lstat(self.directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise LeaseDirectoryUnsafe(f"{self.directory} is not a directory of this gateway's uid")
        os.chmod(self.directory, 0o711)

    def acquire(self, number: int | None = None) -> Lease | None:
        """A free number (that one, when given), locked until released; None when every number is held."""
        numbers = [number] if number is not None else _from_random_start(self.count)
        for candidate in numbers:
            fd = os.open(self.directory / f"{candidate}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return Lease(candidate, fd)
        return None

    def workdir(self, lease: Lease) -> Path:
        """The host directory a sandbox without a private root works in."""
        return self.directory / str(lease.number)


def _from_random_start(count: int) -> list[int]:
    start = random.randrange(count)
    return [(start + offset) % count for offset in range(count)]
