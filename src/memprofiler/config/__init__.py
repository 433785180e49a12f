"""Torch-free typed configuration: one tree of dataclasses, validated when built."""

from memprofiler.config.cuda import HISTORY_CONTEXTS, HISTORY_STACKS, AllocatorHistoryConfig, OomConfig
from memprofiler.config.hooks import MemoryHooksConfig, resolve_hook
from memprofiler.config.root import MemProfilerConfig
from memprofiler.config.schedule import COLLECT_TYPES, CollectFuncsConfig, ScheduleConfig
from memprofiler.units import MEM_UNITS

__all__ = [
    "COLLECT_TYPES",
    "HISTORY_CONTEXTS",
    "HISTORY_STACKS",
    "MEM_UNITS",
    "AllocatorHistoryConfig",
    "CollectFuncsConfig",
    "MemProfilerConfig",
    "MemoryHooksConfig",
    "OomConfig",
    "ScheduleConfig",
    "resolve_hook",
]
