"""CUDA caching-allocator statistics at the start and end of a collected call.

Peak statistics are reset at start, so every ``*.peak`` value in the ``end`` snapshot
belongs to this call alone. Reading the stats needs no device synchronisation: they are
the allocator's host-side bookkeeping.

Before CUDA is initialised nothing is on the GPU and there is no peak to reset: resetting
would initialise CUDA (a context costs hundreds of MiB of host RSS, which a CPU fit on a GPU
machine would then carry in its ``rss`` figures), so the collector leaves it alone and both
snapshots are empty until the training itself initialises CUDA. A call in which that
happens gets the full ``end`` snapshot, whose peaks are then the call's (the allocator's
counters start at zero).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memprofiler.collectors.base import BaseCollector, CallContext
from memprofiler.collectors.cuda_backend import CudaBackend


class CudaStatsCollector(BaseCollector):
    """Collects every flat ``torch.cuda.memory_stats()`` key."""

    name = "cuda"

    def __init__(self, backend: CudaBackend) -> None:
        self._backend = backend

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        if not self._backend.is_initialized():
            return {}  # nothing allocated yet; resetting would initialise CUDA
        self._backend.reset_peak_memory_stats()
        return self._backend.memory_stats()

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        return self._backend.memory_stats()

    def close(self) -> None:
        pass
