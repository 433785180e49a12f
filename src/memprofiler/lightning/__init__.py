"""Thin Lightning adapters over the framework-agnostic :class:`memprofiler.MemProfiler`."""

from memprofiler.lightning.callback import MemProfilerCallback
from memprofiler.lightning.extended_profiler import ExtendedPyTorchProfiler
from memprofiler.lightning.mixin import ProfilerHooksMixin

__all__ = ["ExtendedPyTorchProfiler", "MemProfilerCallback", "ProfilerHooksMixin"]
