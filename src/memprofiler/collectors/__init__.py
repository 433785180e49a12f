"""Collectors: each one turns a collected call into flat start/end metrics."""

from memprofiler.collectors.base import CallContext, Collector
from memprofiler.collectors.cuda_stats import CudaStatsCollector
from memprofiler.collectors.host import HostCollector
from memprofiler.collectors.module_hooks import HookState, ModuleHooksCollector
from memprofiler.collectors.saved_tensors import SavedTensorsCollector

__all__ = [
    "CallContext",
    "Collector",
    "CudaStatsCollector",
    "HookState",
    "HostCollector",
    "ModuleHooksCollector",
    "SavedTensorsCollector",
]
