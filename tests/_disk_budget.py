"""A disk that fills: the writers' system calls (memprofiler.output.writers' seam) raising
ENOSPC after N bytes, as a small filesystem would."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest

from memprofiler.output import writers


class DiskBudget:
    """The writers' system calls on a disk that takes ``left`` more bytes, then ENOSPC.

    Like a real full disk, the call that crosses the limit writes what fits (a short count)
    and the next one raises; and like a real one, space comes back when a file shrinks or is
    deleted (a failed temporary file, an append cut back): what is used is what the files under
    ``root`` hold now.
    """

    def __init__(self, root: Path, left: int | None = None) -> None:
        self.root = root
        self._capacity: int | None = None
        if left is not None:
            self.left = left

    def _used(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.root):
            for name in files:
                with contextlib.suppress(FileNotFoundError):  # a temporary file just replaced
                    total += os.lstat(os.path.join(folder, name)).st_size
        return total

    @property
    def left(self) -> int:
        return (1 << 60) if self._capacity is None else self._capacity - self._used()

    @left.setter
    def left(self, value: int) -> None:
        self._capacity = self._used() + value

    def _take(self, n: int) -> int:
        left = self.left
        if left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return min(n, left)

    def write(self, fd: int, data: memoryview | bytes) -> int:
        return os.write(fd, bytes(data[: self._take(len(data))]))

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        # Overwriting bytes the file already holds takes no new space; growing it does.
        held = max(0, min(len(data), os.fstat(fd).st_size - offset))
        if held:
            return os.pwrite(fd, bytes(data[:held]), offset)
        if len(data) == 0:
            return 0
        return os.pwrite(fd, bytes(data[: self._take(len(data))]), offset)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> DiskBudget:
    budget = DiskBudget(tmp_path)
    monkeypatch.setattr(writers, "_write", budget.write)
    monkeypatch.setattr(writers, "_pwrite", budget.pwrite)
    return budget
