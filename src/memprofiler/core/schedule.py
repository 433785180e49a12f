"""The collection schedule as a pure function of a function's call number.

Calls are counted from 1 per decorated function. The cyclic form maps call ``n`` to
``torch.profiler.schedule`` step ``n - 1`` and returns the same action; the short form
``{warmup_iters, max_iter}`` collects ``warmup_iters < n <= max_iter``.
"""

from __future__ import annotations

import enum

from memprofiler.config import ScheduleConfig


class Action(enum.IntEnum):
    """What to do on a call; values match ``torch.profiler.ProfilerAction``."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3

    @property
    def collects(self) -> bool:
        return self in (Action.RECORD, Action.RECORD_AND_SAVE)


def action(cfg: ScheduleConfig, call: int) -> Action:
    """Return the action for 1-based ``call`` under ``cfg``.

    Example:
        >>> [action(ScheduleConfig(), n).name for n in (1, 2, 3)]
        ['WARMUP', 'RECORD_AND_SAVE', 'NONE']
    """
    if call < 1:
        return Action.NONE
    if cfg.is_short_form:
        assert cfg.warmup_iters is not None and cfg.max_iter is not None
        if cfg.warmup_iters < call < cfg.max_iter:
            return Action.RECORD
        if call == cfg.max_iter:
            return Action.RECORD_AND_SAVE
        return Action.NONE
    step = call - 1
    if step < cfg.skip_first:
        return Action.NONE
    step -= cfg.skip_first
    cycle = cfg.wait + cfg.warmup + cfg.active
    if cfg.repeat > 0 and step // cycle >= cfg.repeat:
        return Action.NONE
    pos = step % cycle
    if pos < cfg.wait:
        return Action.NONE
    if pos < cfg.wait + cfg.warmup:
        return Action.WARMUP
    return Action.RECORD if pos < cycle - 1 else Action.RECORD_AND_SAVE


def is_finished(cfg: ScheduleConfig, call: int) -> bool:
    """True when no call after ``call`` will be warmed up or collected."""
    if cfg.is_short_form:
        assert cfg.max_iter is not None
        return call >= cfg.max_iter
    if cfg.repeat == 0:
        return False
    last = cfg.skip_first + cfg.repeat * (cfg.wait + cfg.warmup + cfg.active)
    return call >= last


def opens_window(cfg: ScheduleConfig, call: int) -> bool:
    """True when ``call`` is the first of a warmup-or-collect run (where recording should start)."""
    current = action(cfg, call)
    if current is Action.NONE:
        return False
    prev = action(cfg, call - 1)
    return prev is Action.NONE or prev is Action.RECORD_AND_SAVE


def closes_window(cfg: ScheduleConfig, call: int, current: Action | None = None) -> bool:
    """True when ``call`` collects and the next call neither warms up nor collects.

    ``current``: ``action(cfg, call)`` where the caller has it already (once per collected call).
    """
    if current is None:
        current = action(cfg, call)
    return current.collects and action(cfg, call + 1) is Action.NONE
