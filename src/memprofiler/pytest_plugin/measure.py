"""Measure one test body with the project's collectors: host RSS peak, saved tensors, CUDA stats.

Loaded only when a marked test runs (it imports torch).
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from memprofiler import metrics as vocab
from memprofiler.collectors.base import CallContext
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.collectors.cuda_stats import CudaStatsCollector
from memprofiler.collectors.host import HostCollector
from memprofiler.pytest_plugin.holders import holders
from memprofiler.pytest_plugin.tracking import BodySavedTensors

_CUDA_CURRENT = vocab.CUDA_ALLOCATED


@dataclass
class Leaks:
    """What the test body left behind, found after a garbage collection."""

    cuda_bytes: int | None = None
    """CUDA bytes allocated now over the start; ``None`` without a GPU."""
    cuda_holders: list[str] = field(default_factory=list)
    saved_count: int = 0
    """Saved activations whose graphs are still alive."""
    saved_bytes: int = 0
    saved_by_module: dict[str, int] = field(default_factory=dict)
    saved_holders: list[str] = field(default_factory=list)


def _live_tensors() -> list[torch.Tensor]:
    # type() rather than isinstance(): some torch objects warn when their __class__ is read.
    return [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]


class BodyMeter:
    """Start and end snapshots of one test body; the project's collectors do the measuring.

    Args:
        host: the session's host collector (its peak method is probed once).
        cuda: the CUDA backend, or ``None`` when no GPU is usable.
        leak: also find what the body leaves behind (a garbage collection and a scan of live
            tensors at start and end: only for ``memory_leak`` tests).
    """

    def __init__(self, host: HostCollector, cuda: CudaBackend | None, leak: bool) -> None:
        self._host = host
        self._cuda_backend = cuda
        self._cuda = CudaStatsCollector(cuda) if cuda is not None else None
        self._saved = BodySavedTensors(track_alive=leak)
        self._leak = leak
        # id -> weak reference: tensors compare elementwise, so no WeakSet.
        self._before: dict[int, weakref.ref[torch.Tensor]] = {}
        self._ctx = CallContext(fn_name="test", call=1, rank=0)
        self.start_metrics: dict[str, Any] = {}

    def start(self, name: str, call: int) -> dict[str, Any]:
        """Snapshot before the body; host first, saved-tensor hooks last (closest to the body)."""
        self._ctx = CallContext(fn_name=name, call=call, rank=0)
        if self._leak:
            gc.collect()
            self._before = {id(t): weakref.ref(t) for t in _live_tensors()}
        metrics: dict[str, Any] = dict(self._host.start(self._ctx))
        # Resetting the peak would initialise CUDA (a context costs hundreds of MiB of host RSS,
        # which a CPU-only test's rss_peak would then carry). Before initialisation the stats
        # are empty and nothing is allocated, so the peak at the end is the body's anyway.
        if self._cuda is not None and self._cuda_backend is not None and self._cuda_backend.memory_stats():
            metrics.update(self._cuda.start(self._ctx))
        metrics.update(self._saved.start(self._ctx))
        self.start_metrics = metrics
        return metrics

    def end(self, ok: bool) -> dict[str, Any]:
        """Snapshot after the body, in the reverse order of :meth:`start`."""
        metrics: dict[str, Any] = dict(self._saved.end(self._ctx, ok))
        if self._cuda is not None:
            metrics.update(self._cuda.end(self._ctx, ok))
        metrics.update(self._host.end(self._ctx, ok))
        if not ok:
            metrics["failed"] = True
        return metrics

    def leaks(self) -> Leaks:
        """What is still held once the body's frame is gone; call after :meth:`end`."""
        gc.collect()
        out = Leaks()
        out.saved_count, out.saved_bytes, out.saved_by_module = self._saved.alive()
        if self._cuda is not None:
            now = self._cuda.end(self._ctx, True).get(_CUDA_CURRENT, 0)
            out.cuda_bytes = max(0, int(now) - int(self.start_metrics.get(_CUDA_CURRENT, 0)))
        want_cuda = bool(out.cuda_bytes)
        if out.saved_count or want_cuda:
            new = [t for t in _live_tensors() if not self._existed(t)]
            if out.saved_count:
                out.saved_holders = holders([t for t in new if t.grad_fn is not None], exclude=[new])
            if want_cuda:
                out.cuda_holders = holders([t for t in new if t.is_cuda], exclude=[new])
            del new
        self._saved.saved = []
        return out

    def _existed(self, t: torch.Tensor) -> bool:
        ref = self._before.get(id(t))
        return ref is not None and ref() is t

    def close(self) -> None:
        self._saved.close()
