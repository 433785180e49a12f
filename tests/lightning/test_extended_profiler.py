"""ExtendedPyTorchProfiler: YAML schedule with repeat, per-rank files, memory merged, crash-safe."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from _env import subprocess_env
from _tiny_lightning import STEP_ALLOC_BYTES, TinyModel
from _tiny_lightning import quiet_trainer as _trainer
from fake_cuda import no_gpu
from memprofiler import ExtendedPyTorchProfiler, MemProfilerCallback, memprofilable
from memprofiler.config import ScheduleConfig
from memprofiler.errors import ConfigError
from memprofiler.units import format_bytes

REPO = Path(__file__).resolve().parents[2]


def _memprofiler(**extra: Any) -> MemProfilerCallback:
    # a CPU run's figures on any machine: no CUDA counters even where CUDA was initialised
    return MemProfilerCallback({"schedule": {"follow_profiler": True}, **extra}, cuda=no_gpu())


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _named(trace: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    """Host-side events by name. With CUDA activity every ``record_function`` range (the
    ``ProfilerStep#N`` ones too) has a ``gpu_user_annotation`` twin of the same name on the
    device's clock; it is left out so the host range is the one compared."""
    return {
        e["name"]: e
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith(prefix) and e.get("cat") != "gpu_user_annotation"
    }


def _memory_spans(trace: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in trace["traceEvents"] if e.get("cat") == "memprofiler" and e["ph"] == "X"}


def _inside(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_trace_holds_profiler_steps_and_memory_counters_of_the_same_calls(tmp_path):
    # GIVEN the extended profiler tracing steps 2-3 and memprofiler following its schedule
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 2})
    trainer = _trainer(tmp_path, prof, steps=6, callbacks=[_memprofiler()])
    # WHEN training runs
    trainer.fit(TinyModel())
    # THEN one valid trace with ProfilerStep#2 and #3 is written under the per-rank name
    trace_file = tmp_path / "memprofiler" / "fit_rank_0.1.pt.trace.json"
    assert sorted(p.name for p in (tmp_path / "memprofiler").glob("*.pt.trace.json")) == [trace_file.name]
    trace = _load(trace_file)
    steps = _named(trace, "ProfilerStep#")
    assert sorted(steps) == ["ProfilerStep#2", "ProfilerStep#3"]
    # AND memory collected exactly the traced calls: training call n is profiler step n - 1
    stats = yaml.safe_load((tmp_path / "memprofiler" / "rank_0_memory_stats.yaml").read_text())
    assert sorted(stats) == [f"0.training_step.{n}.{p}" for n in (3, 4) for p in ("end", "start")]
    spans = _memory_spans(trace)
    assert sorted(spans) == ["training_step.3", "training_step.4"]
    strategy_steps = [
        e for e in trace["traceEvents"] if str(e.get("name", "")).endswith("Strategy.training_step")
    ]
    for n in (3, 4):
        assert _inside(spans[f"training_step.{n}"], steps[f"ProfilerStep#{n - 1}"])
        assert any(_inside(spans[f"training_step.{n}"], s) for s in strategy_steps)
    # AND every counter sits inside the profiled span and carries the snapshot's value
    lo = min(s["ts"] for s in steps.values())
    hi = max(s["ts"] + s["dur"] for s in steps.values())
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C" and e.get("cat") == "memprofiler"]
    assert {c["name"] for c in counters} == {"rss", "rss_peak", "saved_tensors.unique_bytes"}
    assert all(lo <= c["ts"] <= hi for c in counters)
    peaks = sorted(c["args"]["bytes"] for c in counters if c["name"] == "rss_peak")
    assert peaks == sorted(stats[f"0.training_step.{n}.end"]["rss_peak"] for n in (3, 4))
    # AND the step's known 64 MiB allocation shows in the peak over the start RSS
    start = stats["0.training_step.3.start"]["rss"]
    assert spans["training_step.3"]["args"]["rss_peak"] - start >= 0.9 * STEP_ALLOC_BYTES
    # AND the summary table went to the per-rank text file
    summary = (tmp_path / "memprofiler" / "fit_rank_0_summary.txt").read_text()
    assert "cycle 1 of fit" in summary and "ProfilerStep*" in summary
    # AND teardown left nothing behind: no helper callback, no module hooks
    assert not [cb for cb in trainer.callbacks if type(cb).__name__ == "_FlushOnException"]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in trainer.lightning_module.modules())


def test_repeat_two_gives_two_trace_cycles(tmp_path):
    # GIVEN a schedule of two cycles, one active step each (steps 2 and 5)
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 1, "repeat": 2})
    trainer = _trainer(tmp_path, prof, steps=9, callbacks=[_memprofiler()])
    # WHEN training runs past both cycles
    trainer.fit(TinyModel())
    # THEN each cycle has its own trace with its own step and its own memory span
    files = sorted(p.name for p in (tmp_path / "memprofiler").glob("*.pt.trace.json"))
    assert files == ["fit_rank_0.1.pt.trace.json", "fit_rank_0.2.pt.trace.json"]
    first, second = (_load(tmp_path / "memprofiler" / f) for f in files)
    assert sorted(_named(first, "ProfilerStep#")) == ["ProfilerStep#2"]
    assert sorted(_named(second, "ProfilerStep#")) == ["ProfilerStep#5"]
    assert sorted(_memory_spans(first)) == ["training_step.3"]
    assert sorted(_memory_spans(second)) == ["training_step.6"]
    summary = (tmp_path / "memprofiler" / "fit_rank_0_summary.txt").read_text()
    assert "cycle 1 of fit" in summary and "cycle 2 of fit" in summary


def test_crash_mid_cycle_still_writes_trace_and_summary(tmp_path):
    # GIVEN steps 2-4 traced and training that raises in call 5 (step 4), mid-cycle
    # (the failed call keeps its span: its end snapshot is recorded, marked failed)
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 3})
    model = TinyModel(fail_at=5)
    trainer = _trainer(tmp_path, prof, steps=10, callbacks=[_memprofiler()])
    # WHEN fit raises
    with pytest.raises(RuntimeError, match="injected failure in training call 5"):
        trainer.fit(model)
    # THEN the cycle in progress is on disk: a valid trace with the completed steps' memory
    trace = _load(tmp_path / "memprofiler" / "fit_rank_0.1.pt.trace.json")
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= set(_named(trace, "ProfilerStep#"))
    assert sorted(_memory_spans(trace)) == ["training_step.3", "training_step.4", "training_step.5"]
    # AND the per-rank memory trace holds the same completed calls
    memory = _load(tmp_path / "memprofiler" / "memory_trace_rank_0.json")
    assert sorted(_memory_spans(memory)) == ["training_step.3", "training_step.4", "training_step.5"]
    # AND the summary, and the module-name hooks are gone from the model
    assert "ProfilerStep*" in (tmp_path / "memprofiler" / "fit_rank_0_summary.txt").read_text()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_module_name_hooks_exist_only_while_the_profiler_records(tmp_path):
    # GIVEN steps 1 (warmup) to 3 (active) of six
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 2})
    model = TinyModel()
    # WHEN training runs
    _trainer(tmp_path, prof, steps=6).fit(model)
    # THEN the per-module hooks were on for calls 2-4 only (step n - 1 in the window), and are gone
    assert model.module_name_hooks == [False, True, True, True, False, False]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_summary_table_honours_name_width_and_sort_key(tmp_path):
    # GIVEN a wide name column and sorting by call count
    prof = ExtendedPyTorchProfiler(
        schedule_cfg={"wait": 1, "warmup": 1, "active": 1},
        max_name_column_width=120,
        sort_by_key="count",
        row_limit=-1,
    )
    trainer = _trainer(tmp_path, prof, steps=4)
    # WHEN training runs
    trainer.fit(TinyModel())
    summary = (tmp_path / "fit_rank_0_summary.txt").read_text()
    # THEN long module names are whole (Lightning's 55-column default cuts them)
    assert "[pl][module]torch.nn.modules.linear.Linear: net.0" in summary
    # AND rows are sorted by the last column, "# of Calls", descending
    counts = [int(m.group(1)) for m in re.finditer(r"^\s*\S.*?\s(\d+)\s*$", summary, re.M)]
    assert len(counts) >= 5 and counts == sorted(counts, reverse=True)


def test_yaml_config_runs_through_lightning_cli(tmp_path):
    # GIVEN the shipped profiler config on top of a tiny model
    from memprofiler.lightning.cli import MemProfilerCLI

    extra = tmp_path / "extra.yaml"
    extra.write_text("trainer:\n  profiler:\n    dict_kwargs: {profile_memory: true}\n")
    args = [
        "fit",
        "--config",
        str(REPO / "configs" / "profiler.yaml"),
        "--config",
        str(extra),
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=5",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    # WHEN LightningCLI builds and runs it (jsonargparse fills every default, use_cuda included)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = MemProfilerCLI(
            TinyModel,
            args=args,
            trainer_defaults={"accelerator": "cpu"},
            save_config_kwargs={"overwrite": True},
        )
    # THEN the profiler came from YAML, with its schedule, and warned nothing about use_cuda
    prof = cli.trainer.profiler
    assert isinstance(prof, ExtendedPyTorchProfiler)
    assert (prof.schedule_cfg.wait, prof.schedule_cfg.warmup, prof.schedule_cfg.active) == (1, 1, 2)
    assert not [w for w in caught if "use_cuda" in str(w.message)]
    assert prof._profiler_kwargs["profile_memory"] is True  # dict_kwargs reach torch.profiler.profile
    # AND memory followed it: calls 3 and 4, inside the one trace written
    stats = yaml.safe_load((tmp_path / "memprofiler" / "rank_0_memory_stats.yaml").read_text())
    assert sorted({k.rsplit(".", 1)[0] for k in stats}) == ["0.training_step.3", "0.training_step.4"]
    trace = _load(tmp_path / "memprofiler" / "fit_rank_0.1.pt.trace.json")
    assert sorted(_memory_spans(trace)) == ["training_step.3", "training_step.4"]
    assert any(e.get("name") == "[memory]" for e in trace["traceEvents"])  # Kineto's own memory events


class TinyValModel(TinyModel):
    @memprofilable
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", ((self.net(x) - y) ** 2).mean())

    def val_dataloader(self) -> Any:
        return self.train_dataloader()


def test_validate_stage_steps_on_validation_step(tmp_path):
    # GIVEN trainer.validate with memory following the profiler on validation_step
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 2})
    cb = MemProfilerCallback(
        {"schedule": {"follow_profiler": True}, "collect_funcs": {"default": ["validation_step"]}}
    )
    # WHEN validation runs
    _trainer(tmp_path, prof, steps=-1, callbacks=[cb]).validate(TinyValModel())
    # THEN the stage's step drives the schedule: validation calls 3 and 4 in steps 2 and 3
    trace = _load(tmp_path / "memprofiler" / "validate_rank_0.1.pt.trace.json")
    assert sorted(_named(trace, "ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert sorted(_memory_spans(trace)) == ["validation_step.3", "validation_step.4"]
    assert "cycle 1 of validate" in (tmp_path / "memprofiler" / "validate_rank_0_summary.txt").read_text()


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"schedule_cfg": {"activ": 2}}, "schedule_cfg.activ"),
        ({"schedule_cfg": {"wait": 0}}, "schedule_cfg.wait"),
        ({"schedule_cfg": {"active": 0}}, "schedule_cfg.active"),
        ({"schedule_cfg": {"repeat": -1}}, "schedule_cfg.repeat"),
        ({"schedule_cfg": {"warmup": "x"}}, "schedule_cfg.warmup"),
        ({"schedule": lambda step: None}, "schedule"),
        ({"on_trace_ready": print}, "on_trace_ready"),
        ({"max_name_column_width": 0}, "max_name_column_width"),
        ({"step_functions": []}, "step_functions"),
        ({"step_functions": "training_step"}, "step_functions"),
        ({"step_functions": ["train_step"]}, "step_functions"),
    ],
)
def test_bad_options_raise_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=re.escape(f"`{key}`")):
        ExtendedPyTorchProfiler(**kwargs)


def test_unknown_sort_key_is_lightnings_error_and_device_keys_are_accepted():
    with pytest.raises(MisconfigurationException, match="sort_by_key"):
        ExtendedPyTorchProfiler(sort_by_key="nope")
    assert (
        ExtendedPyTorchProfiler(sort_by_key="self_device_time_total")._sort_by_key == "self_device_time_total"
    )


def test_use_cuda_is_dropped_quietly_when_unset_and_with_a_warning_when_set(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the no-GPU machine, on any machine
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prof = ExtendedPyTorchProfiler(use_cuda=None)
    assert "use_cuda" not in prof._profiler_kwargs
    assert [a.name for a in prof._profiler_kwargs["activities"]] == ["CPU"]
    with pytest.warns(UserWarning, match="`use_cuda` is deprecated and ignored"):
        ExtendedPyTorchProfiler(use_cuda=True)


def test_follow_profiler_without_the_extended_profiler_warns_and_keeps_own_schedule(tmp_path):
    # GIVEN follow_profiler but Lightning's plain trainer (no profiler)
    cb = MemProfilerCallback({"schedule": {"follow_profiler": True, "warmup": 0, "active": 1}})
    trainer = _trainer(tmp_path, None, steps=3, callbacks=[cb])
    # WHEN training runs THEN a warning says so, and call 1 (its own schedule) is collected
    with pytest.warns(UserWarning, match="follow_profiler"):
        trainer.fit(TinyModel())
    assert cb.profiler is not None
    assert sorted(cb.profiler.snapshots) == ["0.training_step.1.end", "0.training_step.1.start"]


def test_follow_profiler_rejects_the_short_form():
    with pytest.raises(ConfigError, match="`follow_profiler`"):
        ScheduleConfig(follow_profiler=True, warmup_iters=2)


#: Set in the process the test below starts for itself.
_ALONE = "MEMPROFILER_TEST_ALONE"


@pytest.mark.slow
def test_traces_and_memory_categories_are_read_back_by_the_profiler_views(tmp_path):
    # The allocator's count in a trace is the whole process's CPU allocator: tensors earlier tests
    # of a worker left alive (1.3 MiB after the fast set) are counted beside the step's, and the
    # two peaks compared below would differ by them. So the test runs in a process of its own.
    if not os.environ.get(_ALONE):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "slow",
             f"{__file__}::test_traces_and_memory_categories_are_read_back_by_the_profiler_views"],
            env=subprocess_env(REPO / "src", **{_ALONE: "1"}), cwd=REPO, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return
    # GIVEN the extended profiler with the options torch's memory categories need
    from memprofiler.analysis.traces.views import build_views

    prof = ExtendedPyTorchProfiler(
        schedule_cfg={"wait": 1, "warmup": 1, "active": 2},
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    )
    # WHEN 5 training steps run (steps 2 and 3 profiled)
    _trainer(tmp_path, prof, steps=5).fit(TinyModel())
    # THEN the categories file lies beside the trace
    cats = tmp_path / "fit_rank_0.1.memory_categories.json"
    assert cats in prof.written_files and cats.is_file()
    views = build_views([tmp_path])
    assert views is not None
    (view,) = views.traces
    assert view.rank == 0 and [s.step for s in view.steps] == ["ProfilerStep#2", "ProfilerStep#3"]
    # AND the 64 MiB scratch tensor of every step is attributed to aten::ones
    stats = {s.name: s for s in view.devices[0].stats}
    assert stats["aten::ones"].calls == 2
    assert stats["aten::ones"].alloc_size == 2 * STEP_ALLOC_BYTES
    # AND the category timeline peaks with that tensor live, parameters and gradients classified
    (cpu,) = view.categories
    params = sum(p.numel() * p.element_size() for p in TinyModel().parameters())
    assert cpu.peak_by_category["parameter"] == params
    assert cpu.peak_by_category["gradient"] == params
    assert STEP_ALLOC_BYTES in [b for *_, b in cpu.live_at_peak]
    assert cpu.peak_bytes == sum(cpu.peak_by_category.values()) >= STEP_ALLOC_BYTES + 2 * params
    # on the trace's clock: the category peak is the memory view's peak
    assert cpu.peak_ms == pytest.approx(view.devices[0].memory.peak_ms, abs=0.01)
    # AND Lightning's module names label the module view
    assert {"net (Sequential)", "net.0 (Linear)", "net.2 (Linear)"} <= {m.name for m in view.modules}
    # AND each tensor live at the peak says what made it: the scratch tensor aten::ones (through
    # its factory), the first layer's weight its shape [32, 16] as the operators saw it
    origin = {t: cpu.origins[t] for t, *_ in cpu.live_at_peak if t in cpu.origins}
    scratch = next(t for t, _, _, b in cpu.live_at_peak if b == STEP_ALLOC_BYTES)
    assert origin[scratch].operator == "aten::ones (aten::empty)"
    assert origin[scratch].shape in ("", "[16777216] float32")  # a shape only if an operator read it
    assert "[32, 16] float32" in {o.shape for o in origin.values()}
    gradients = [t for t, _, c, _ in cpu.live_at_peak if c == "gradient"]
    assert gradients and all(origin[t].operator and origin[t].shape for t in gradients)
    # AND the two peaks are put side by side: the same memory, parameters from before the cycle
    # among the categories
    (gap,) = view.peak_gaps
    assert gap.device == "CPU" and gap.allocated_at_category_peak is not None
    assert gap.preexisting >= params
    assert gap.reason.startswith(f"The allocator peaks at {format_bytes(gap.allocated_peak)}")
    assert "the same memory" in gap.reason


def test_memory_categories_are_skipped_without_the_options_they_need(tmp_path):
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 2}, profile_memory=True)
    _trainer(tmp_path, prof, steps=5).fit(TinyModel())
    assert not list(tmp_path.glob("*.memory_categories.json"))


def test_a_merge_fault_keeps_kinetos_trace_and_training_goes_on(tmp_path, monkeypatch):
    # GIVEN merging memory events fails
    import memprofiler.lightning.extended_profiler as ext

    def broken(*args: Any, **kwargs: Any) -> bytes:
        raise ValueError("broken merge")

    monkeypatch.setattr(ext.ChromeTrace, "with_rows", broken)
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 2})
    trainer = _trainer(tmp_path, prof, steps=5, callbacks=[_memprofiler()])
    # WHEN training runs THEN it completes with a warning
    with pytest.warns(UserWarning, match="without memory events"):
        trainer.fit(TinyModel())
    assert trainer.global_step == 5
    # AND Kineto's own trace is on disk, valid, without our events
    trace = _load(tmp_path / "memprofiler" / "fit_rank_0.1.pt.trace.json")
    assert sorted(_named(trace, "ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert not _memory_spans(trace)


class _BrokenRows:
    """A timeline whose text cannot be built."""

    def events_json(self, *args: Any, **kwargs: Any) -> str:
        raise TypeError("no text")

    def metadata(self, pid: int | str) -> list[dict[str, Any]]:
        return []


def test_a_fault_in_our_rows_leaves_kinetos_bytes_as_they_were_and_a_cut_trace_is_refused():
    # GIVEN a profiler merging rows that fail, and a trace with an operator
    from memprofiler.output.trace_files import TraceCycle

    prof = ExtendedPyTorchProfiler()
    prof.step_timeline = None
    prof.add_memory_timeline(_BrokenRows())  # type: ignore[arg-type]
    kineto = b' {"baseTimeNanoseconds": 0,\n "traceEvents": [{"ph": "X", "ts": 1.0, "dur": 2.0}\n]}'
    # WHEN the cycle is merged THEN one warning, and Kineto's bytes unchanged
    with pytest.warns(
        UserWarning, match=r"wrote trace cycle \d+ without memory events: TypeError\('no text'\)"
    ):
        assert prof._merged(kineto, TraceCycle(1)) == kineto
    # AND a trace cut short (a full disk) or no object is not written at all
    for cut in (kineto[:40], b"[1]"):
        with pytest.raises(ValueError, match="Kineto's trace is no JSON"):
            prof._merged(cut, TraceCycle(1))


@pytest.mark.cuda
def test_cuda_kernels_and_cuda_memory_counters_share_one_trace(tmp_path):
    # GIVEN a GPU run: activities must include CUDA without being asked
    prof = ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 2})
    assert torch.profiler.ProfilerActivity.CUDA in prof._profiler_kwargs["activities"]
    assert prof._sort_by_key == "device_time_total"
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        default_root_dir=tmp_path,
        max_steps=5,
        profiler=prof,
        # the real CUDA backend here: the CPU tests' callback hides the GPU
        callbacks=[MemProfilerCallback({"schedule": {"follow_profiler": True}})],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    # WHEN training runs
    trainer.fit(TinyModel())
    # THEN kernels and our CUDA counters are in the same trace, counters inside the steps
    trace = _load(tmp_path / "memprofiler" / "fit_rank_0.1.pt.trace.json")
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    steps = _named(trace, "ProfilerStep#")
    lo = min(s["ts"] for s in steps.values())
    hi = max(s["ts"] + s["dur"] for s in steps.values())
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C" and e.get("cat") == "memprofiler"]
    assert {"cuda.allocated", "cuda.reserved", "cuda.allocated_peak", "cuda.reserved_peak"} <= {
        c["name"] for c in counters
    }
    assert all(lo <= c["ts"] <= hi for c in counters)
    spans = _memory_spans(trace)
    for n in (3, 4):
        assert _inside(spans[f"training_step.{n}"], steps[f"ProfilerStep#{n - 1}"])


def test_a_run_shorter_than_the_schedule_ends_cleanly(tmp_path):
    # GIVEN a schedule whose first warmup step is never reached (wait 5, 3 steps)
    prof = ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg={"wait": 5, "warmup": 1, "active": 2})
    model = TinyModel()
    # WHEN fit runs to the end
    with pytest.warns(UserWarning, match="ended before the schedule recorded any step"):
        _trainer(tmp_path, prof, steps=3).fit(model)
    # THEN it finished normally, with no trace to write
    assert model.calls == 3
    assert not list(tmp_path.glob("*.pt.trace.json"))


@pytest.mark.slow  # long-running: six profiler cycles, each trace written and gzipped
def test_memory_categories_follow_the_traces_gzip_and_retention(tmp_path):
    # GIVEN three cycles with memory categories on, gzip, and only the newest cycle kept
    from memprofiler.analysis.traces.views import build_views

    prof = ExtendedPyTorchProfiler(
        schedule_cfg={"wait": 1, "warmup": 1, "active": 2, "repeat": 3},
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
        trace_files={"use_gzip": True, "num_traces_to_keep": 1},
    )
    # WHEN the three cycles run
    _trainer(tmp_path, prof, steps=13).fit(TinyModel())
    # THEN only the last cycle's trace and categories remain, both gzip
    assert sorted(p.name for p in tmp_path.glob("fit_rank_0.*")) == [
        "fit_rank_0.3.memory_categories.json.gz",
        "fit_rank_0.3.pt.trace.json.gz",
    ]
    # AND the report reads the gzipped categories beside the gzipped trace
    views = build_views([tmp_path])
    assert views is not None
    (view,) = views.traces
    (cpu,) = view.categories
    params = sum(p.numel() * p.element_size() for p in TinyModel().parameters())
    assert cpu.peak_by_category["parameter"] == params
    assert STEP_ALLOC_BYTES in [b for *_, b in cpu.live_at_peak]


def test_memprofilers_own_work_stays_out_of_the_summary_and_its_cost_is_said_at_setup(tmp_path):
    # GIVEN the profiler with Python stacks and a host sampler, and memprofiler's module tracker
    # over the same steps
    prof = ExtendedPyTorchProfiler(
        schedule_cfg={"wait": 1, "warmup": 1, "active": 1}, with_stack=True, profile_memory=True,
        sort_by_key="self_cpu_time_total", row_limit=-1, timeline={"host_interval_s": 0.01},
    )  # fmt: skip
    trainer = _trainer(tmp_path, prof, steps=4, callbacks=[_memprofiler(track_module_mem=True)])
    # WHEN training runs
    with pytest.warns(
        UserWarning, match=r"`track_module_mem` with ExtendedPyTorchProfiler\(with_stack=True\)"
    ):
        trainer.fit(TinyModel())
    (summary_file,) = tmp_path.rglob("fit_rank_0_summary.txt")
    summary = summary_file.read_text()
    # THEN no row is the tracker's dispatch or the sampler thread's (other threads, e.g. a test
    # runner's, are not memprofiler's and may show)
    names = [line.strip().split("  ")[0] for line in summary.splitlines()]
    for own in ("PythonDispatchMode", "mem_tracker.py", "mod_tracker.py", "host_sampler.py"):
        assert not [n for n in names if own in n], own
    # AND the model's operators the tracker dispatched are still there, with what was left out said
    assert any(n.startswith("aten::addmm") for n in names)
    assert re.search(r"memprofiler's own work is left out of this table: [\d,]+ events, [\d,.]+ ms", summary)
    # the sampler's thread at least (a profiler cycle may see it under more than one thread id)
    assert re.search(r"\(and \d+ threads? of its own\)", summary)
