"""The one narrow seam between memprofiler and ``torch.cuda``.

Every CUDA call the profiler makes goes through a :class:`CudaBackend`. Tests replace it
with a fake that replays recorded data, so all of our orchestration runs on CPU-only
machines; on a GPU the real backend forwards to ``torch.cuda``.
"""

from __future__ import annotations

from typing import Any

import torch


class CudaBackend:
    """Forwards to ``torch.cuda``. Subclass or duck-type it to fake a device in tests."""

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def memory_stats(self) -> dict[str, Any]:
        return dict(torch.cuda.memory_stats())

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats()


_default: CudaBackend | None = None


def default_backend() -> CudaBackend:
    """The process-wide real backend."""
    global _default
    if _default is None:
        _default = CudaBackend()
    return _default
