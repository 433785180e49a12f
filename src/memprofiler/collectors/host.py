"""Host memory: RSS and VMS at start and end, and the true peak RSS inside the call.

Two peak methods:

* ``clear_refs`` (Linux): writing ``5`` to ``/proc/self/clear_refs`` resets the kernel's
  RSS high-water mark; ``VmHWM`` in ``/proc/self/status`` is then the exact peak since the
  reset. No thread, no sampling error. Costs two small procfs accesses per call, on files
  kept open (as ``/proc/self/statm`` for RSS and VMS): no open, no psutil per call.
* ``sampler``: a daemon thread polls RSS every ``interval_ms`` while a collected call runs,
  and sleeps (no GIL held) in between. It only exists during collected calls. It can miss a
  peak shorter than the interval.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from typing import Any

import psutil

from memprofiler import metrics
from memprofiler.collectors.base import BaseCollector, CallContext

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def clear_refs_supported() -> bool:
    """Whether the kernel high-water-mark reset works in this process."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return _read_hwm() is not None
    except OSError:
        return False


def _read_hwm() -> int | None:
    with open(_STATUS, "rb") as f:
        return _parse_hwm(f.read())


def _parse_hwm(status: bytes) -> int | None:
    """``VmHWM`` of a ``/proc/self/status`` text, in bytes; ``None`` where the kernel has none."""
    at = status.find(b"VmHWM:")
    if at < 0:
        return None
    return int(status[at + 6 : status.index(b"kB", at)]) * 1024


_STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Procfs:
    """``/proc/self`` files kept open and re-read with ``pread`` (reopened after a fork)."""

    def __init__(self) -> None:
        self._pid = -1
        self._fds: dict[str, int] = {}

    def _fd(self, path: str, flags: int) -> int:
        if self._pid != os.getpid():
            self.close()
            self._pid = os.getpid()
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, flags)
        return fd

    def reset_hwm(self) -> None:
        os.write(self._fd(_CLEAR_REFS, os.O_WRONLY), b"5")

    def hwm(self) -> int | None:
        return _parse_hwm(os.pread(self._fd(_STATUS, os.O_RDONLY), 1 << 16, 0))

    def rss_vms(self) -> tuple[int, int]:
        size, resident = os.pread(self._fd(_STATM, os.O_RDONLY), 128, 0).split()[:2]
        return int(resident) * _PAGE, int(size) * _PAGE

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


class _Sampler(threading.Thread):
    def __init__(self, proc: psutil.Process, interval_s: float) -> None:
        super().__init__(name="memprofiler-rss-sampler", daemon=True)
        self._proc = proc
        self._interval = interval_s
        self._stop_event = threading.Event()
        self.peak = proc.memory_info().rss

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            rss = self._proc.memory_info().rss
            if rss > self.peak:
                self.peak = rss

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


class HostCollector(BaseCollector):
    """Collects ``rss``, ``vms`` (start and end) and ``rss_peak`` (end)."""

    name = "cpu"

    def __init__(self, method: str = "auto", interval_ms: float = 1.0) -> None:
        if method == "auto":
            method = "clear_refs" if clear_refs_supported() else "sampler"
        self.method = method
        self._interval_s = interval_ms / 1000.0
        self._proc_error: Exception | None = None
        try:  # reads /proc/self/stat: a locked-down /proc refuses it; start() then faults once
            self._proc: psutil.Process | None = psutil.Process()
        except Exception as err:
            self._proc, self._proc_error = None, err
        self._sampler: _Sampler | None = None
        self._procfs = _Procfs() if self.method == "clear_refs" else None

    def _memory(self) -> tuple[int, int]:
        """``(rss, vms)``: from the open ``statm`` with clear_refs (Linux), else psutil."""
        if self._procfs is not None:
            return self._procfs.rss_vms()
        mem = self._process().memory_info()
        return mem.rss, mem.vms

    def _process(self) -> psutil.Process:
        if self._proc is None:
            raise self._proc_error or OSError("psutil.Process() failed")
        return self._proc

    def _begin_peak(self) -> None:
        if self._procfs is not None:
            self._procfs.reset_hwm()
        else:
            self._sampler = _Sampler(self._process(), self._interval_s)
            self._sampler.start()

    def _end_peak(self, rss_end: int) -> int:
        if self._procfs is not None:
            hwm = self._procfs.hwm()
            return max(hwm or 0, rss_end)
        assert self._sampler is not None
        peak = self._sampler.stop()
        self._sampler = None
        return max(peak, rss_end)

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self._begin_peak()
        rss, vms = self._memory()
        ctx.scratch["host.rss_start"] = rss
        return {metrics.RSS: rss, metrics.VMS: vms}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        rss, vms = self._memory()
        peak = self._end_peak(rss)
        return {
            metrics.RSS: rss,
            metrics.VMS: vms,
            metrics.RSS_PEAK: max(peak, ctx.scratch.get("host.rss_start", 0)),
        }

    def close(self) -> None:
        if self._procfs is not None:
            self._procfs.close()
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
