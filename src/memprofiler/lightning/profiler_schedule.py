"""The extended profiler's schedule: validated from plain data, and cycling ``repeat`` times.

Step ``k`` of the schedule is the ``(k+1)``-th call of the stage's step function, the same
count :class:`~memprofiler.MemProfiler` uses (call ``n`` is step ``n - 1``), which is what
lets ``schedule.follow_profiler`` share one window between the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.profilers.pytorch import ScheduleWrapper
from torch.profiler import ProfilerAction
from typing_extensions import override

from memprofiler.config import ScheduleConfig
from memprofiler.config._build import build_dataclass
from memprofiler.errors import ConfigError

#: ``schedule_cfg`` keys taken when absent: Lightning's default schedule, one cycle.
DEFAULT_SCHEDULE: dict[str, int] = {"skip_first": 0, "wait": 1, "warmup": 1, "active": 3, "repeat": 1}
#: The step function whose calls advance the schedule in each Trainer stage.
STAGE_STEP = {
    "fit": "training_step",
    "validate": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}


def build_schedule_config(schedule_cfg: Mapping[str, Any] | None) -> ScheduleConfig:
    """Validate ``schedule_cfg`` (missing keys from :data:`DEFAULT_SCHEDULE`).

    Raises:
        ConfigError: unknown key, wrong type, or a schedule whose step 0 is not idle.
    """
    given = dict(schedule_cfg or {})
    for key in given:
        if key not in DEFAULT_SCHEDULE:
            raise ConfigError(
                f"schedule_cfg.{key}",
                f"unknown key; allowed: {', '.join(DEFAULT_SCHEDULE)} (torch.profiler.schedule)",
            )
    try:
        cfg = build_dataclass(ScheduleConfig, {**DEFAULT_SCHEDULE, **given})
    except ConfigError as err:
        raise err.prefixed("schedule_cfg") from None
    if cfg.skip_first == 0 and cfg.wait == 0:
        # Lightning enters the profiler before the first step and decides step 0's action
        # then, with no step running: step 0 can never be warmed up or recorded.
        raise ConfigError(
            "schedule_cfg.wait",
            "got skip_first=0 and wait=0, but the first step (step 0) cannot be profiled under "
            "Lightning; set `wait: 1` (or `skip_first: 1`) or more",
        )
    return cfg


class CyclicSchedule(ScheduleWrapper):
    """Lightning's wrapper without its stop-after-the-first-cycle rule.

    ``torch.profiler.schedule`` itself returns ``NONE`` once ``repeat`` cycles are done
    (never, with ``repeat: 0``), so no extra bookkeeping is needed to stop.
    """

    @override
    def __call__(self, num_step: int) -> ProfilerAction:
        if self._current_action is None:
            return ProfilerAction.NONE
        self._step()
        action = self._schedule(max(self.num_step, 0))
        if self._prev_schedule_action is ProfilerAction.RECORD and action is ProfilerAction.WARMUP:
            # Kept from Lightning: with several `step_functions`, one function's warmup must
            # not interrupt another's recording (torch rejects RECORD -> WARMUP).
            action = ProfilerAction.RECORD
        self._prev_schedule_action = action
        return action
