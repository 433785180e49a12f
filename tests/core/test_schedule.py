"""The schedule is a pure function; it must agree with torch.profiler.schedule exactly."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch.profiler

from memprofiler.config import ScheduleConfig
from memprofiler.core.schedule import Action, action, closes_window, is_finished, opens_window
from memprofiler.errors import ConfigError

GRID = list(itertools.product([0, 2], [0, 1, 2], [0, 1, 2], [1, 2, 3], [0, 1, 2]))


@pytest.mark.parametrize(("skip_first", "wait", "warmup", "active", "repeat"), GRID)
def test_cyclic_form_matches_torch_profiler_schedule(skip_first, wait, warmup, active, repeat):
    # GIVEN the same parameters for both
    cfg = ScheduleConfig(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = torch.profiler.schedule(
            skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
        )
    # THEN call n is torch step n - 1, for every call
    for call in range(1, 40):
        assert int(action(cfg, call)) == int(ref(call - 1).value), call


@pytest.mark.parametrize(("skip_first", "wait", "warmup", "active", "repeat"), GRID)
def test_is_finished_means_nothing_later_is_active(skip_first, wait, warmup, active, repeat):
    cfg = ScheduleConfig(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    for call in range(1, 30):
        if is_finished(cfg, call):
            assert all(action(cfg, later) is Action.NONE for later in range(call + 1, 60))


def test_default_collects_exactly_call_two():
    cfg = ScheduleConfig()
    collected = [c for c in range(1, 50) if action(cfg, c).collects]
    assert collected == [2]
    assert action(cfg, 1) is Action.WARMUP


@pytest.mark.parametrize(("warmup_iters", "max_iter"), [(0, 1), (1, 2), (1, 4), (3, 5), (0, 6)])
def test_short_form_collects_warmup_iters_lt_call_le_max_iter(warmup_iters, max_iter):
    cfg = ScheduleConfig(warmup_iters=warmup_iters, max_iter=max_iter)
    collected = [c for c in range(1, 20) if action(cfg, c).collects]
    assert collected == [c for c in range(1, 20) if warmup_iters < c <= max_iter]
    assert is_finished(cfg, max_iter)
    assert not is_finished(cfg, max_iter - 1)


def test_short_form_defaults_max_iter_to_one_past_warmup():
    cfg = ScheduleConfig(warmup_iters=3)
    assert [c for c in range(1, 20) if action(cfg, c).collects] == [4]


def test_repeat_zero_runs_forever():
    cfg = ScheduleConfig(wait=1, warmup=0, active=1, repeat=0)
    assert [c for c in range(1, 11) if action(cfg, c).collects] == [2, 4, 6, 8, 10]
    assert not is_finished(cfg, 10_000)


def test_window_edges():
    cfg = ScheduleConfig(wait=1, warmup=1, active=2, repeat=2)
    # calls: 1 wait, 2 warmup, 3-4 active, 5 wait, 6 warmup, 7-8 active
    assert [c for c in range(1, 10) if opens_window(cfg, c)] == [2, 6]
    assert [c for c in range(1, 10) if closes_window(cfg, c)] == [4, 8]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"active": 0}, "active"),
        ({"wait": -1}, "wait"),
        ({"repeat": -2}, "repeat"),
        ({"warmup_iters": 3, "max_iter": 3}, "max_iter"),
        ({"warmup_iters": 1, "active": 3}, "active"),
    ],
)
def test_bad_schedule_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"`{key}`"):
        ScheduleConfig(**kwargs)
