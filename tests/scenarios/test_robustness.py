"""Faults found in review: copies of attached modules, odd value types, kills, reuse, bad paths."""

from __future__ import annotations

import copy
import enum
import pickle

import numpy as np
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import StochasticWeightAveraging

from conftest import D, TinyMLP, load_stats, make_trainer
from memprofiler import ConfigError, MemProfiler, MemProfilerCallback, MemProfilerConfig
from memprofiler.collectors.registry import build_collectors
from memprofiler.core.decorator import ATTACH_ATTR
from memprofiler.output.writers import to_plain


def test_deepcopy_and_pickle_of_an_attached_module_come_out_unattached(tmp_path):
    model = TinyMLP()
    prof = MemProfiler({}, save_dir=tmp_path, rank=0).setup(model)
    prof.attach(model)
    twin = copy.deepcopy(model)
    assert twin.__dict__[ATTACH_ATTR] is None
    assert pickle.loads(pickle.dumps(model)).__dict__[ATTACH_ATTR] is None
    twin.training_step((torch.randn(2, D),), 0)  # an unattached copy just runs
    assert prof.call_count("training_step") == 0


def test_stochastic_weight_averaging_deep_copies_the_module_and_training_goes_on(tmp_path):
    # GIVEN SWA, which deep-copies the LightningModule in on_fit_start, after our setup
    cb = MemProfilerCallback({"save_dir": str(tmp_path)})
    model = TinyMLP()
    make_trainer(tmp_path, [cb, StochasticWeightAveraging(swa_lrs=0.01)], max_epochs=2).fit(model)
    # THEN training finished and call 2 was collected
    assert model.steps_run == 12
    assert "0.training_step.2.end" in load_stats(tmp_path)


class Kind(enum.Enum):
    A = "a"


class Level(enum.IntEnum):
    HIGH = 3


def test_numpy_scalars_and_enums_become_plain_yaml():
    data = {
        "f": np.float64(1.5),
        "i": np.int64(7),
        "s": np.str_("x"),
        "e": Kind.A,
        "l": Level.HIGH,
        "b": True,
    }
    plain = to_plain(data)
    assert plain == {"f": 1.5, "i": 7, "s": "x", "e": "a", "l": 3, "b": True}
    assert [type(v) for v in plain.values()] == [float, int, str, str, int, bool]
    assert yaml.safe_load(yaml.safe_dump(plain)) == plain


def test_a_value_yaml_cannot_hold_does_not_lose_the_other_files(tmp_path):
    prof = MemProfiler({"dump_memorystats_pickle": True}, save_dir=tmp_path, rank=0).setup()
    prof.snapshots["0.f.1.end"] = {"odd": object()}  # falls back to str(), never raises
    written = {p.name for p in prof.dump()}
    assert {"rank_0_memory_stats.yaml", "rank_0_memory_stats.pickle"} <= written
    assert yaml.safe_load((tmp_path / "rank_0_memory_stats.yaml").read_text())["0.f.1.end"]["odd"]


def test_files_are_written_when_a_window_closes_so_a_killed_run_keeps_them(tmp_path):
    # GIVEN a window of calls 2-3 and nobody calling dump() or teardown() (as after SIGKILL)
    prof = MemProfiler({"schedule": {"warmup": 1, "active": 2}}, save_dir=tmp_path, rank=0).setup()
    for _ in range(2):
        with prof.profile("training_step"):
            pass
    assert not (tmp_path / "rank_0_memory_stats.yaml").exists()  # call 2 does not close it
    with prof.profile("training_step"):
        pass
    # THEN call 3 closed the window and its snapshots are already on disk
    assert list(load_stats(tmp_path)) == [
        f"0.training_step.{c}.{p}" for c in (2, 3) for p in ("start", "end")
    ]


def test_measuring_collectors_run_innermost():
    # Allocator-history dumps must not land inside the host peak-RSS window.
    from fake_cuda import FakeCudaBackend

    cfg = MemProfilerConfig.from_any({"cuda_allocator_history": True})
    names = [r.collector.name for r in build_collectors(cfg, FakeCudaBackend(), lambda m: None)]
    assert names.index("cuda_allocator_history") < names.index("cpu") < names.index("cuda")


def test_custom_reset_hooks_still_fire_pre_forward_every_call(tmp_path):
    calls: list[str] = []
    model = TinyMLP()
    prof = MemProfiler(
        {
            "schedule": {"warmup": 0, "active": 3},
            "enable_memory_hooks": True,
            "memory_hooks": {
                "pre_forward_hooks": [lambda s, m, a: calls.append("pre")],
                "post_forward_hooks": [lambda s, m, a, o: calls.append("post")],
                "reset_state_hooks": [lambda s: None],
            },
        },
        save_dir=tmp_path,
        rank=0,
    ).setup(model)
    for _ in range(3):
        with prof.profile("training_step", module=model):
            model(torch.randn(2, D))
    assert calls == ["pre", "post"] * 3


def test_the_same_callback_in_a_second_trainer_profiles_that_run(tmp_path):
    cb = MemProfilerCallback()
    make_trainer(tmp_path / "a", [cb]).fit(TinyMLP())
    make_trainer(tmp_path / "b", [cb]).fit(TinyMLP())
    for run in ("a", "b"):
        assert list(load_stats(tmp_path / run / "memprofiler")) == [
            "0.training_step.2.start",
            "0.training_step.2.end",
        ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read config file"),
        (b"\xff\xfe\x00bad", "cannot read config file"),
        (b"- a\n- list\n", "expected a mapping of MemProfilerConfig fields in"),
        (b"schedule: {activ: 1}\n", "`schedule.activ`: unknown key"),
    ],
)
def test_config_file_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "mem.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        MemProfilerConfig.from_any(str(path))
    assert message in str(info.value) and "mem.yaml" in str(info.value)
