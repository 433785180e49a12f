"""A fake CUDA seam for the statistics collector: a scripted allocator."""

from __future__ import annotations

from typing import Any

from memprofiler.cuda_backend import CudaBackend


class ScriptedCuda(CudaBackend):
    """Reports ``allocated`` bytes as current and the running peak since the last reset."""

    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0
        self.resets = 0

    def is_available(self) -> bool:
        return True

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def memory_stats(self) -> dict[str, Any]:
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.peak,
            "num_ooms": 0,
        }

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1
        self.peak = self.allocated
