"""memprofiler: memory profiling for PyTorch and Lightning training.

The core (:class:`MemProfiler`, :func:`memprofilable`, :class:`MemProfilerConfig`) has no
Lightning import; the Lightning adapters are loaded on first use. :class:`MemProfiler` (and
with it torch) is loaded on first use too, so the ``memprofiler`` console script, which only
reads files, starts without paying torch's import time (nor the config's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memprofiler._version import __version__
from memprofiler.core.decorator import memprofilable
from memprofiler.errors import ArtifactError, ConfigError, MemProfilerError

if TYPE_CHECKING:
    from memprofiler.advice import Advice, advise
    from memprofiler.config import MemProfilerConfig
    from memprofiler.core.profiler import MemProfiler
    from memprofiler.estimate import (
        EstimatePlan,
        MemoryEstimate,
        PipelinePlan,
        estimate_memory,
        estimate_plan,
    )
    from memprofiler.lightning.callback import MemProfilerCallback
    from memprofiler.lightning.cli import MemProfilerCLI
    from memprofiler.lightning.extended_profiler import ExtendedPyTorchProfiler
    from memprofiler.lightning.mixin import ProfilerHooksMixin


_LAZY = {
    "advise": "memprofiler.advice",
    "Advice": "memprofiler.advice",
    "MemProfiler": "memprofiler.core.profiler",
    # (the `memprofiler` console script reads files; it needs no config)
    "MemProfilerConfig": "memprofiler.config",
    "ExtendedPyTorchProfiler": "memprofiler.lightning.extended_profiler",
    "MemProfilerCallback": "memprofiler.lightning.callback",
    "MemProfilerCLI": "memprofiler.lightning.cli",
    "ProfilerHooksMixin": "memprofiler.lightning.mixin",
    "estimate_memory": "memprofiler.estimate",
    "estimate_plan": "memprofiler.estimate",
    "EstimatePlan": "memprofiler.estimate",
    "MemoryEstimate": "memprofiler.estimate",
    "PipelinePlan": "memprofiler.estimate",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memprofiler' has no attribute {name!r}")


__all__ = [
    "Advice",
    "ArtifactError",
    "ConfigError",
    "EstimatePlan",
    "ExtendedPyTorchProfiler",
    "MemProfiler",
    "MemProfilerCLI",
    "MemProfilerCallback",
    "MemProfilerConfig",
    "MemProfilerError",
    "MemoryEstimate",
    "PipelinePlan",
    "ProfilerHooksMixin",
    "__version__",
    "advise",
    "estimate_memory",
    "estimate_plan",
    "memprofilable",
]
