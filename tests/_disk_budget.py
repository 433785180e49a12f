"""A disk that fills: the writers' system calls (memprofiler.output.writers' seam) raising
ENOSPC after N bytes, as a small filesystem would."""

from __future__ import annotations

import errno
import os

import pytest

from memprofiler.output import writers


class DiskBudget:
    """The writers' system calls with a disk that takes ``left`` more bytes, then ENOSPC.

    Like a real full disk, the call that crosses the limit writes what fits (a short count)
    and the next one raises.
    """

    def __init__(self, left: int) -> None:
        self.left = left

    def _take(self, n: int) -> int:
        if self.left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(n, self.left)
        self.left -= n
        return n

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
def disk(monkeypatch: pytest.MonkeyPatch) -> DiskBudget:
    budget = DiskBudget(1 << 60)
    monkeypatch.setattr(writers, "_write", budget.write)
    monkeypatch.setattr(writers, "_pwrite", budget.pwrite)
    return budget
