"""Warnings that are issued once per process, on rank zero unless asked otherwise."""

from __future__ import annotations

import logging
import warnings

log = logging.getLogger("memprofiler")


class MemProfilerWarning(UserWarning):
    """A capability is missing or the profiler hit a fault; training continues."""


_seen: set[str] = set()


def warn_once(message: str, rank: int = 0, all_ranks: bool = False) -> None:
    """Warn ``message`` once per process; only on rank 0 unless ``all_ranks``."""
    if (rank != 0 and not all_ranks) or message in _seen:
        return
    _seen.add(message)
    warnings.warn(f"memprofiler: {message}", MemProfilerWarning, stacklevel=3)
