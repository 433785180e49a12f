"""What a MemProfiler holds comes in by its constructor, and the model later by ``bind``."""

from __future__ import annotations

import pytest
from torch import nn

from memprofiler import MemProfiler


def test_constructor_options_reach_the_profiler(tmp_path):
    # GIVEN every option given at construction
    model = nn.Linear(2, 2)
    events = []
    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 1}},
        save_dir=tmp_path,
        rank=0,
        module=model,
        step_fn=lambda: 41,
        summary_collective=True,
        listeners=[events.append],
    ).setup()
    # WHEN one call is profiled
    with prof.profile("training_step"):
        pass
    prof.teardown()
    # THEN each is in use: the module, the step, the collective summary, the listener
    assert prof.module is model
    assert prof.current_step() == 41
    assert prof.summary_collective is True
    assert [(e.fn_name, e.call, e.phase) for e in events] == [
        ("training_step", 1, "start"),
        ("training_step", 1, "end"),
    ]


def test_setting_options_after_construction_is_deprecated(tmp_path):
    prof = MemProfiler({}, save_dir=tmp_path, rank=0)
    with pytest.warns(DeprecationWarning, match=r"`MemProfiler\(step_fn=...\)`"):
        prof.step_fn = lambda: 3
    with pytest.warns(DeprecationWarning, match=r"`MemProfiler\(summary_collective=...\)`"):
        prof.summary_collective = True
    assert prof.current_step() == 3 and prof.summary_collective is True


def test_attach_is_only_a_fallback_for_the_module(tmp_path):
    # GIVEN a profiler without a model, two modules attached, then a model bound
    first, second, bound = nn.Linear(1, 1), nn.Linear(1, 1), nn.Linear(1, 1)
    prof = MemProfiler({}, save_dir=tmp_path, rank=0)
    prof.attach(first)
    prof.attach(second)
    # THEN until a model is given the first attached module stands in for it
    assert prof.module is first
    prof.bind(bound, [])
    assert prof.module is bound
    prof.attach(second)
    assert prof.module is bound
