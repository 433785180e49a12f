"""Torch-free typed configuration: one tree of dataclasses, validated when built."""

from memprofiler.config.root import (
    COLLECT_TYPES,
    HISTORY_CONTEXTS,
    HISTORY_STACKS,
    MEM_UNITS,
    AllocatorHistoryConfig,
    CollectFuncsConfig,
    MemoryHooksConfig,
    MemProfilerConfig,
    OomConfig,
    ScheduleConfig,
    resolve_hook,
)

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
