"""Opt-in forward hooks: right figures, installed only for the window, state on the profiler."""

from __future__ import annotations

import pytest
import torch

from conftest import B, D, H, O, TinyMLP, load_stats, make_trainer
from memprofiler import MemProfiler, MemProfilerCallback
from memprofiler.collectors.module_hooks import HookState

F32 = 4


def _hook_count(model: torch.nn.Module) -> int:
    from torch.nn.modules import module as nn_module

    per_module = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return per_module + len(nn_module._global_forward_hooks) + len(nn_module._global_forward_pre_hooks)


@pytest.mark.parametrize("call_submodule", [False, True])
def test_npp_figures_whether_step_calls_self_or_a_submodule(tmp_path, call_submodule):
    # GIVEN training_step calling self(x) or self.net(x) directly (the ancestor read 0 there)
    model = TinyMLP(call_submodule=call_submodule)
    cb = MemProfilerCallback(
        {"schedule": {"warmup": 0, "active": 1}, "enable_memory_hooks": True, "save_dir": str(tmp_path)}
    )
    make_trainer(tmp_path, [cb], limit_train_batches=2).fit(model)
    end = load_stats(tmp_path)["0.training_step.1.end"]
    # THEN npp counts what forward packed: x, relu out twice, weight2.t(); pow runs after forward
    assert end["npp_pre_forward"] == 0
    assert end["npp_post_forward"] == F32 * (B * D + 2 * B * H + H * O)
    assert end["npp_diff"] == end["npp_post_forward"]
    assert end["rss_diff"] == end["rss_post_forward"] - end["rss_pre_forward"]
    assert end["rss_pre_forward"] > 0


def test_hooks_live_only_in_the_window(tmp_path):
    model = TinyMLP()
    baseline = _hook_count(model)
    prof = MemProfiler(
        {"schedule": {"wait": 1, "warmup": 0, "active": 2}, "enable_memory_hooks": True},
        save_dir=tmp_path,
        rank=0,
    ).setup(model)
    prof.attach(model)
    counts = []
    for _ in range(4):
        with prof.profile("training_step", module=model):
            counts.append(_hook_count(model))
            model(torch.randn(2, D))
        counts.append(_hook_count(model))
    # call 1 waits; calls 2-3 collect, hooks retained between them (training_step is retained);
    # after call 3 the window is closed and every hook is gone
    assert counts[0] == baseline and counts[1] == baseline
    assert counts[2] > baseline and counts[3] > baseline  # retained after call 2
    assert counts[4] > baseline and counts[5] == baseline
    assert counts[6] == baseline and counts[7] == baseline


def test_not_retained_functions_remove_hooks_after_each_call(tmp_path):
    model = TinyMLP()
    prof = MemProfiler(
        {
            "schedule": {"warmup": 0, "active": 2},
            "enable_memory_hooks": True,
            "retain_hooks_for_funcs": [],
        },
        save_dir=tmp_path,
        rank=0,
    ).setup(model)
    with prof.profile("training_step", module=model):
        model(torch.randn(2, D))
    assert _hook_count(model) == 0


def test_custom_hooks_and_attrs(tmp_path):
    calls: list[str] = []

    def pre(state: HookState, module: torch.nn.Module, args: tuple) -> None:
        calls.append("pre")
        state.batch_rows = args[0].shape[0]

    model = TinyMLP()
    prof = MemProfiler(
        {
            "schedule": {"warmup": 0, "active": 1},
            "enable_memory_hooks": True,
            "memory_hooks": {"pre_forward_hooks": [pre], "post_forward_hooks": [], "reset_state_hooks": []},
            "save_hook_attrs": ["batch_rows"],
        },
        save_dir=tmp_path,
        rank=0,
    ).setup(model)
    with prof.profile("training_step", module=model):
        model(torch.randn(5, D))
        model(torch.randn(5, D))
    assert calls == ["pre"]  # outermost forward, first entry only
    assert prof.snapshots["0.training_step.1.end"]["batch_rows"] == 5
    assert not hasattr(model, "batch_rows")


def test_only_the_first_levels_are_hooked_and_the_outermost_forward_is_seen(tmp_path):
    # GIVEN a deep model: root -> body -> 3 blocks -> 4 layers each (17 modules below the root)
    blocks = [torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)]) for _ in range(3)]
    root = torch.nn.Sequential()
    root.body = torch.nn.Sequential(*blocks)
    prof = MemProfiler(
        {
            "schedule": {"warmup": 0, "active": 3},
            "enable_memory_hooks": True,
            "enable_saved_tensors_hooks": False,
        },
        save_dir=tmp_path,
        rank=0,
        module=root,
    )
    hooked = []
    with prof:
        for direct in (False, True):
            with prof.profile("training_step"), torch.no_grad():
                # WHEN the step runs the root, then one of the first two levels directly
                (root.body if direct else root)(torch.ones(1, 2))
                hooked.append(_hook_count(root))
    # THEN only the root, body and the 3 blocks carry hooks (a pair each), not the 12 layers
    assert hooked == [2 * 5, 2 * 5]
    # AND both steps saw their outermost forward
    stats = load_stats(tmp_path)
    for call in (1, 2):
        assert stats[f"0.training_step.{call}.end"]["rss_post_forward"] > 0
