"""Warnings issued once per profiler, on rank zero unless asked otherwise, at the user's line
(:func:`memprofiler.user_line.warn_at_user`)."""

from __future__ import annotations

from memprofiler.errors import MemProfilerWarning, log
from memprofiler.user_line import warn_at_user

__all__ = ["MemProfilerWarning", "Warner", "log", "warn_at_user"]


class Warner:
    """Warns each message once; the profiler owns one, so a new profiler warns afresh.

    Args:
        rank: global rank; only rank 0 warns unless a message is for ``all_ranks``.
    """

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self._seen: set[str] = set()

    def __call__(self, message: str, all_ranks: bool = False) -> None:
        if (self.rank != 0 and not all_ranks) or message in self._seen:
            return
        self._seen.add(message)
        log.debug("warning: %s", message)
        warn_at_user(f"memprofiler: {message}", MemProfilerWarning)

    @property
    def seen(self) -> frozenset[str]:
        return frozenset(self._seen)
