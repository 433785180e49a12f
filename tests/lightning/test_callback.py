"""MemProfilerCallback in real Trainer runs on CPU."""

from __future__ import annotations

import os
import pickle
import warnings

import pytest
import yaml

from conftest import B, D, H, O, TinyMLP, load_stats, make_trainer
from memprofiler import ArtifactError, ConfigError, MemProfilerCallback, ProfilerHooksMixin, memprofilable
from memprofiler.core.decorator import ATTACH_ATTR
from memprofiler.core.warn import MemProfilerWarning

F32 = 4


def test_default_schedule_collects_call_two_with_exact_saved_bytes(tmp_path):
    # GIVEN the default config
    cb = MemProfilerCallback()
    trainer = make_trainer(tmp_path, [cb], limit_train_batches=4)
    # WHEN fitting
    trainer.fit(TinyMLP())
    # THEN the default save_dir holds exactly call 2's start and end
    stats = load_stats(tmp_path / "memprofiler")
    assert list(stats) == ["0.training_step.2.start", "0.training_step.2.end"]
    end = stats["0.training_step.2.end"]
    assert end["saved_tensors.unique_bytes"] == F32 * (B * D + B * H + B * O)
    assert end["rss_peak"] >= end["rss"] > 0


def test_yaml_is_plain_and_pickle_matches(tmp_path):
    cb = MemProfilerCallback(
        {"schedule": {"warmup": 0, "active": 2}, "dump_memorystats_pickle": True, "save_dir": str(tmp_path)}
    )
    make_trainer(tmp_path, [cb]).fit(TinyMLP())
    text = (tmp_path / "rank_0_memory_stats.yaml").read_text()
    assert "!!python" not in text
    from_yaml = yaml.safe_load(text)
    with open(tmp_path / "rank_0_memory_stats.pickle", "rb") as f:
        assert f.read(2) == b"\x80\x04"  # protocol 4
        f.seek(0)
        assert pickle.load(f) == from_yaml
    assert list(from_yaml) == [f"0.training_step.{c}.{p}" for c in (1, 2) for p in ("start", "end")]


def test_exception_in_step_five_keeps_steps_one_to_four(tmp_path):
    # GIVEN every call collected and a failure in step 5
    cb = MemProfilerCallback({"schedule": {"warmup": 0, "active": 10}, "save_dir": str(tmp_path)})
    trainer = make_trainer(tmp_path, [cb], limit_train_batches=8)
    with pytest.raises(RuntimeError, match="injected failure in step 5"):
        trainer.fit(TinyMLP(fail_at=5))
    # THEN steps 1-4 are on disk, valid; step 5's end is there too, marked failed
    stats = load_stats(tmp_path)
    for call in range(1, 5):
        end = stats[f"0.training_step.{call}.end"]
        assert end["saved_tensors.unique_bytes"] == F32 * (B * D + B * H + B * O)
        assert "failed" not in end
    assert "0.training_step.5.start" in stats
    assert stats["0.training_step.5.end"]["failed"] is True
    assert stats["0.training_step.5.end"]["rss_peak"] >= stats["0.training_step.5.start"]["rss"]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_validation_step_and_short_schedule(tmp_path):
    cb = MemProfilerCallback(
        {
            "schedule": {"warmup_iters": 1, "max_iter": 2},
            "collect_funcs": {"default": ["training_step", "validation_step"]},
            "save_dir": str(tmp_path),
        }
    )
    make_trainer(tmp_path, [cb], limit_val_batches=2).fit(TinyMLP())
    stats = load_stats(tmp_path)
    assert {k.rsplit(".", 2)[0] for k in stats} == {"0.training_step", "0.validation_step"}
    assert "0.validation_step.2.end" in stats
    # no graph is built under no_grad: nothing is saved for backward
    assert stats["0.validation_step.2.end"]["saved_tensors.unique_bytes"] == 0


def test_unwritable_save_dir_fails_at_setup(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cb = MemProfilerCallback({"save_dir": str(blocker / "sub")})
    model = TinyMLP()
    with pytest.raises(ArtifactError, match=r"`save_dir`.*not writable"):
        make_trainer(tmp_path, [cb]).fit(model)
    assert model.steps_run == 0


def test_disabled_attaches_nothing(tmp_path):
    model = TinyMLP()
    make_trainer(tmp_path, [MemProfilerCallback({"enabled": False})]).fit(model)
    assert ATTACH_ATTR not in model.__dict__
    assert not (tmp_path / "memprofiler").exists()
    assert model.steps_run == 6


def test_profiler_fault_warns_and_training_continues(tmp_path, monkeypatch):
    from memprofiler.collectors import host

    def boom(self, ctx):
        raise OSError("procfs went away")

    monkeypatch.setattr(host.HostCollector, "start", boom)
    cb = MemProfilerCallback({"schedule": {"warmup": 0, "active": 3}, "save_dir": str(tmp_path)})
    model = TinyMLP()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb]).fit(model)
    assert model.steps_run == 6
    assert any("collector `cpu` failed" in str(w.message) for w in caught if w.category is MemProfilerWarning)
    stats = load_stats(tmp_path)
    assert "rss" not in stats["0.training_step.3.end"]
    assert stats["0.training_step.3.end"]["saved_tensors.count"] == 5


def test_profiler_detached_after_fit(tmp_path):
    model = TinyMLP()
    make_trainer(tmp_path, [MemProfilerCallback()]).fit(model)
    assert ATTACH_ATTR not in model.__dict__


class MixinModel(ProfilerHooksMixin, TinyMLP):
    pass


def test_mixin_takes_memprofiler_cfg(tmp_path):
    model = MixinModel(memprofiler_cfg={"schedule": {"warmup": 0, "active": 1}, "save_dir": str(tmp_path)})
    make_trainer(tmp_path, []).fit(model)
    assert list(load_stats(tmp_path)) == ["0.training_step.1.start", "0.training_step.1.end"]


def test_memprofilable_is_reachable_from_the_profiler_class():
    from memprofiler import MemProfiler

    assert MemProfiler.memprofilable is memprofilable


_TWO = (
    "two memprofiler profilers on one Trainer: {a} and {b}; only one would collect and both write "
    "the same files. Keep one of them (remove the other, or give it `enabled: false`)"
)
_CB = "a `MemProfilerCallback` in `trainer.callbacks`"


def test_two_callbacks_on_one_trainer_are_refused_before_training(tmp_path):
    # GIVEN two enabled profiler callbacks writing to the same directory
    model = TinyMLP()
    first, second = (MemProfilerCallback({"save_dir": str(tmp_path / "mp")}) for _ in range(2))
    # WHEN fit starts THEN set-up refuses the pair in one line, and no step has run
    with pytest.raises(ConfigError) as info:
        make_trainer(tmp_path, [first, second]).fit(model)
    assert str(info.value) == _TWO.format(a=_CB, b=_CB)
    assert model.steps_run == 0
    assert not (tmp_path / "mp" / "rank_0_memory_stats.yaml").exists()


def test_a_disabled_second_callback_is_allowed(tmp_path):
    cbs = [MemProfilerCallback({"save_dir": str(tmp_path)}), MemProfilerCallback({"enabled": False})]
    make_trainer(tmp_path, cbs).fit(TinyMLP())
    assert list(load_stats(tmp_path)) == ["0.training_step.2.start", "0.training_step.2.end"]


def test_mixin_fit_then_validate_on_one_trainer_is_one_profiler(tmp_path):
    # GIVEN a mixin module collecting every training and validation call: each stage asks it
    # for its callbacks again
    cfg = {
        "schedule": {"warmup": 0, "active": 10},
        "collect_funcs": {"default": ["training_step", "validation_step"]},
        "save_dir": str(tmp_path),
    }
    model = MixinModel(memprofiler_cfg=cfg)
    trainer = make_trainer(tmp_path, [], limit_val_batches=2)
    # WHEN fit (6 training, 2 validation calls) and then validate (2 more) run on one Trainer
    trainer.fit(model)
    (fit_cb,) = [cb for cb in trainer.callbacks if isinstance(cb, MemProfilerCallback)]
    fit_profiler = fit_cb.profiler
    trainer.validate(model, verbose=False)
    # THEN the Trainer holds the same single callback and profiler in both stages
    (validate_cb,) = [cb for cb in trainer.callbacks if isinstance(cb, MemProfilerCallback)]
    assert validate_cb is fit_cb
    assert validate_cb.profiler is fit_profiler
    # AND validate's calls continue the fit's count in the same file (a second profiler would
    # restart at call 1 and overwrite it)
    calls = [("training_step", c) for c in range(1, 7)] + [("validation_step", c) for c in range(1, 5)]
    assert list(load_stats(tmp_path)) == [f"0.{fn}.{c}.{p}" for fn, c in calls for p in ("start", "end")]


def test_mixin_config_plus_a_trainer_callback_is_refused(tmp_path):
    # GIVEN a module profiling itself through `memprofiler_cfg` and a Trainer callback as well
    # (Lightning would otherwise drop the Trainer's callback for the module's without a word)
    model = MixinModel(memprofiler_cfg={"save_dir": str(tmp_path / "a")})
    trainer = make_trainer(tmp_path, [MemProfilerCallback({"save_dir": str(tmp_path / "b")})])
    # WHEN fit starts THEN one line names both and no step has run
    with pytest.raises(ConfigError) as info:
        trainer.fit(model)
    mixin = "`memprofiler_cfg` of `MixinModel` (`ProfilerHooksMixin`)"
    assert str(info.value) == _TWO.format(a=mixin, b=_CB)
    assert model.steps_run == 0


def test_attachment_does_not_share_the_ancestors_attribute(tmp_path):
    # GIVEN a module that also carries the ancestor mixin's own profiler in `_memprofiler`
    model = TinyMLP()
    ancestor = object()
    model._memprofiler = ancestor
    # WHEN memprofiler profiles it THEN each keeps its own object and memprofiler collects
    make_trainer(tmp_path, [MemProfilerCallback({"save_dir": str(tmp_path)})]).fit(model)
    assert ATTACH_ATTR == "_memprofiler_attachment"
    assert model._memprofiler is ancestor
    assert list(load_stats(tmp_path)) == ["0.training_step.2.start", "0.training_step.2.end"]


def test_memprofilable_on_a_plain_function_is_refused_when_decorated():
    with pytest.raises(ConfigError) as info:

        @memprofilable
        def train_step(batch):
            return batch

    assert str(info.value) == (
        "`@memprofilable` on the plain function `train_step` would collect nothing: it finds the "
        "profiler through the object a method is called on. Make it a method of the object given to "
        '`MemProfiler.attach` (a LightningModule), or wrap its calls in `with prof.profile("train_step", '
        "module=model):`"
    )
