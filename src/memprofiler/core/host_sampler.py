"""Host metrics sampled on an interval by a background thread: CPU, memory, disk, network, RSS.

Framework-free: the Lightning profiler runs one, and so can a plain loop or Fabric
(``with HostSampler(0.5) as sampler: ...``). The thread sleeps in ``Event.wait`` between samples
(no GIL held); one sample is a handful of ``/proc`` reads through psutil, about 0.1 ms.
Rates (disk, network) are the difference of two cumulative counters over the time between
them, so the first sample of a rate track comes one interval after the start.

Samples are stamped with ``time.time_ns()``, the clock Kineto stamps CPU events with, so
they line up with the operators of a PyTorch profiler trace without calibration.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType

import psutil

from memprofiler import metrics as vocab
from memprofiler.config.timeline import HOST_METRICS

#: Counter tracks per metric group, as drawn in the trace: ``track -> unit`` (the args key).
TRACKS: dict[str, dict[str, str]] = {
    vocab.HOST_CPU: {vocab.HOST_CPU_PERCENT: "percent", vocab.PROCESS_CPU_PERCENT: "percent"},
    vocab.HOST_MEMORY: {vocab.HOST_MEMORY_USED: "bytes", vocab.HOST_MEMORY_PERCENT: "percent"},
    vocab.HOST_DISK: {vocab.HOST_DISK_READ: "bytes_per_s", vocab.HOST_DISK_WRITE: "bytes_per_s"},
    vocab.HOST_NETWORK: {vocab.HOST_NET_SENT: "bytes_per_s", vocab.HOST_NET_RECV: "bytes_per_s"},
    vocab.RSS: {vocab.PROCESS_RSS: "bytes"},
}

Sample = tuple[int, dict[str, float]]


class HostSampler:
    """A daemon thread appending ``(t_ns, {track: value})`` to :attr:`samples` every ``interval_s``.

    Args:
        interval_s: seconds between samples.
        metrics: groups to read, from :data:`~memprofiler.config.timeline.HOST_METRICS`.
        max_samples: samples kept; the oldest go first.
        on_error: called once, from the sampler thread, with a one-line message when psutil
            fails; the failing group is then dropped and the others go on.

    Example:
        >>> with HostSampler(0.5, ["cpu", "rss"]) as sampler:  # doctest: +SKIP
        ...     train()
        >>> sampler.samples[-1]
        (1718000000123456789, {'host.cpu_percent': 87.5, 'process.cpu_percent': 99.0, 'process.rss': ...})
    """

    def __init__(
        self,
        interval_s: float,
        metrics: Iterable[str] = HOST_METRICS,
        max_samples: int = 100_000,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.interval_s = float(interval_s)
        self.metrics = [m for m in HOST_METRICS if m in set(metrics)]
        unknown = sorted(set(metrics) - set(HOST_METRICS))
        if unknown:
            raise ValueError(f"unknown host metric {unknown[0]!r}; allowed: {', '.join(HOST_METRICS)}")
        self.samples: deque[Sample] = deque(maxlen=max_samples)
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: psutil.Process | None = None
        self._proc_error: Exception | None = None
        try:  # reads /proc/self/stat: a locked-down /proc refuses it
            self._proc = psutil.Process()
        except Exception as err:
            self._proc_error = err
        self._last: dict[str, tuple[int, float]] = {}  # cumulative counters at the last sample
        self._bad_values: set[str] = set()  # tracks already warned about a non-finite value

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> HostSampler:
        """Take a first sample now and start the thread (again after :meth:`stop`)."""
        if self.running:
            return self
        self._stop.clear()
        # CPU percentages are since the previous call: prime them so the first sample is real.
        if vocab.HOST_CPU in self.metrics:
            try:
                psutil.cpu_percent(interval=None)
                self._process().cpu_percent(interval=None)
            except Exception as err:
                self._drop(vocab.HOST_CPU, err)
        self.sample()
        self._thread = threading.Thread(target=self._run, name="memprofiler-host-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and wait for it (at most ``timeout_s``); safe to call twice or from a
        signal handler's path."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> HostSampler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> Sample | None:
        """Read every metric group once and append the sample; ``None`` if nothing could be read."""
        t_ns = time.time_ns()
        values: dict[str, float] = {}
        for group in list(self.metrics):
            try:
                read = self._read(group, t_ns)
            except Exception as err:  # psutil.Error, OSError, PermissionError on /proc
                self._drop(group, err)
                continue
            for track, value in read.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    values[track] = float(value)
                elif track not in self._bad_values:  # None, NaN, inf: never written to a trace
                    self._bad_values.add(track)
                    self._error(f"host sampler: {track} read {value!r}; such values are skipped")
        if not values:
            return None
        sample = (t_ns, values)
        self.samples.append(sample)
        return sample

    def _drop(self, group: str, err: Exception) -> None:
        if group in self.metrics:
            self.metrics.remove(group)
            self._error(f"host sampler: cannot read {group} ({type(err).__name__}: {err}); dropped")

    def _error(self, message: str) -> None:
        if self._on_error is not None:
            with contextlib.suppress(Exception):  # a warning hook must not stop the sampler
                self._on_error(message)

    def _process(self) -> psutil.Process:
        if self._proc is None:
            raise self._proc_error or OSError("psutil.Process() failed")
        return self._proc

    def _read(self, group: str, t_ns: int) -> dict[str, float]:
        if group == vocab.HOST_CPU:
            return {
                vocab.HOST_CPU_PERCENT: psutil.cpu_percent(interval=None),
                vocab.PROCESS_CPU_PERCENT: self._process().cpu_percent(interval=None),
            }
        if group == vocab.HOST_MEMORY:
            vm = psutil.virtual_memory()
            return {
                vocab.HOST_MEMORY_USED: vm.total - vm.available,
                vocab.HOST_MEMORY_PERCENT: vm.percent,
            }
        if group == vocab.RSS:
            return {vocab.PROCESS_RSS: float(self._process().memory_info().rss)}
        if group == vocab.HOST_DISK:
            disk = psutil.disk_io_counters()
            if disk is None:
                raise OSError("no disk counters on this host")
            return self._rates(
                t_ns, {vocab.HOST_DISK_READ: disk.read_bytes, vocab.HOST_DISK_WRITE: disk.write_bytes}
            )
        net = psutil.net_io_counters()
        return self._rates(t_ns, {vocab.HOST_NET_SENT: net.bytes_sent, vocab.HOST_NET_RECV: net.bytes_recv})

    def _rates(self, t_ns: int, totals: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for track, total in totals.items():
            if not isinstance(total, (int, float)) or not math.isfinite(total):
                out[track] = total  # refused (and warned about once) by `sample`
                continue
            last = self._last.get(track)
            self._last[track] = (t_ns, float(total))
            if last is not None and t_ns > last[0]:
                out[track] = max(0.0, (total - last[1]) * 1e9 / (t_ns - last[0]))
        return out

    def between(self, lo_ns: int, hi_ns: int) -> list[Sample]:
        """The samples taken in ``[lo_ns, hi_ns]``."""
        return [s for s in list(self.samples) if lo_ns <= s[0] <= hi_ns]
