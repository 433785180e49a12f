"""The unified step timeline and self-managing trace files of ExtendedPyTorchProfiler, end to end."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from _env import subprocess_env
from _tiny_lightning import TinyModel
from _tiny_lightning import quiet_trainer as _trainer
from memprofiler import ExtendedPyTorchProfiler, MemProfilerCallback
from memprofiler.analysis.runs.ids import profiler_trace_run_id
from memprofiler.errors import ConfigError
from memprofiler.output.step_timeline import DATA_TID, HOOK_TID

ROOT = Path(__file__).resolve().parents[2]
#: A schedule of three steps per cycle (wait, warmup, active): cycle k traces step 3k - 1.
CYCLE = {"wait": 1, "warmup": 1, "active": 1}


def _spans(trace: dict[str, Any], tid: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("tid") == tid:
            out.setdefault(e["name"], []).append(e)
    return out


def _six_cycles_gzip_keep_two() -> ExtendedPyTorchProfiler:
    return ExtendedPyTorchProfiler(
        schedule_cfg={**CYCLE, "repeat": 6},
        trace_files={
            "folder": "traces",
            "filename": "ep{epoch}-ba{batch}-rank{rank}.pt.trace.json",
            "use_gzip": True,
            "num_traces_to_keep": 2,
        },
    )


#: Cycles 5 and 6 trace steps 14 and 17; TinyModel has 12 batches an epoch, so both are in epoch 1.
LAST_TWO = {"ep1-ba14-rank0.pt.trace.json.gz": 14, "ep1-ba17-rank0.pt.trace.json.gz": 17}


def _assert_last_two(names: list[str], read: Any) -> None:
    assert sorted(n for n in names if ".pt.trace." in n) == sorted(LAST_TWO)
    for name, step in LAST_TWO.items():
        trace = json.loads(gzip.decompress(read(name)))
        steps = {
            e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
        }
        assert steps == {f"ProfilerStep#{step}"}
        assert trace["memprofiler"]["batch"] == step and trace["memprofiler"]["epoch"] == 1


@pytest.mark.slow  # long-running: six profiler cycles, each trace written and gzipped
def test_gzip_and_keep_two_over_six_cycles_in_memprofilers_run_dir(tmp_path):
    # GIVEN six trace cycles, gzip, keep 2, and memprofiler in the same Trainer
    prof = _six_cycles_gzip_keep_two()
    cb = MemProfilerCallback({"schedule": {"follow_profiler": True}})
    # WHEN training runs all six cycles
    _trainer(tmp_path, prof, steps=18, callbacks=[cb]).fit(TinyModel())
    # THEN exactly the last two cycles' traces remain, next to memprofiler's files, each a gzip json reads
    traces = tmp_path / "memprofiler" / "traces"
    _assert_last_two([p.name for p in traces.iterdir()], lambda n: (traces / n).read_bytes())
    assert (tmp_path / "memprofiler" / "memory_trace_rank_0.json").is_file()
    assert (traces / "step_timeline_rank_0.json").is_file()


def test_gzip_and_keep_two_over_six_cycles_on_s3(tmp_path, s3_bucket):
    # GIVEN memprofiler's save_dir on a real S3 server
    prof = _six_cycles_gzip_keep_two()
    cb = MemProfilerCallback({"schedule": {"follow_profiler": True}, "save_dir": f"{s3_bucket}/run"})
    # WHEN training runs
    _trainer(tmp_path, prof, steps=18, callbacks=[cb]).fit(TinyModel())
    # THEN the store holds the last two cycles only, beside the run's own files
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    root = f"{s3_bucket[len('s3://') :]}/run"
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/traces", refresh=True)]
    _assert_last_two(names, lambda n: fs.cat_file(f"{root}/traces/{n}"))
    assert "memory_trace_rank_0.json" in [p.rsplit("/", 1)[-1] for p in fs.ls(root, refresh=True)]


def test_unknown_template_field_fails_before_training_with_one_line():
    with pytest.raises(ConfigError) as err:
        ExtendedPyTorchProfiler(trace_files={"filename": "rank{rank}.{step}.pt.trace.json"})
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("`trace_files.filename`: unknown field {step} in ")
    assert "allowed: {run_name}, {rank}, {local_rank}, {node_rank}, {world_size}, {stage}, {epoch}, " in str(
        err.value
    )


def test_a_folder_with_earlier_traces_is_refused_before_training_unless_overwrite(tmp_path):
    # GIVEN a first run's trace in dirpath
    _trainer(tmp_path, ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE), steps=3).fit(
        TinyModel()
    )
    assert (tmp_path / "fit_rank_0.1.pt.trace.json").is_file()
    # WHEN a second run writes there THEN it fails at set-up, before any training step
    model = TinyModel()
    with pytest.raises(ConfigError, match=r"already holds 'fit_rank_0.1.pt.trace.json'.*overwrite: true"):
        _trainer(tmp_path, ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE), steps=3).fit(model)
    assert model.calls == 0
    # AND with overwrite it runs
    prof = ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, trace_files={"overwrite": True})
    _trainer(tmp_path, prof, steps=3).fit(model)
    assert model.calls == 3


def test_overwrite_never_rewrites_a_run_whose_traces_are_named_otherwise(tmp_path):
    # GIVEN a first run in dirpath whose traces carry its run name
    first = {"filename": "a_{stage}_rank_{rank}.{cycle}.pt.trace.json"}
    _trainer(
        tmp_path, ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, trace_files=first), steps=3
    ).fit(TinyModel())
    timeline = (tmp_path / "step_timeline_rank_0.json").read_bytes()
    summary = (tmp_path / "fit_rank_0_summary.txt").read_bytes()
    # WHEN a second run names its traces otherwise, without and then with overwrite
    second = {"filename": "b_{stage}_rank_{rank}.{cycle}.pt.trace.json"}
    model = TinyModel()
    with pytest.raises(
        ConfigError, match=r"fit_rank_0_summary.txt is from an earlier run; set `trace_files.overwrite"
    ):
        _trainer(
            tmp_path,
            ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, trace_files=second),
            steps=3,
        ).fit(model)
    prof = ExtendedPyTorchProfiler(
        dirpath=tmp_path, schedule_cfg=CYCLE, trace_files={**second, "overwrite": True}
    )
    with pytest.raises(
        ConfigError, match=r"traces are named otherwise \('a_fit_rank_0.1.pt.trace.json'\).*own folder"
    ):
        _trainer(tmp_path, prof, steps=3).fit(model)
    # THEN neither trained, and the first run's step timeline and summary are untouched
    assert model.calls == 0
    assert (tmp_path / "step_timeline_rank_0.json").read_bytes() == timeline
    assert (tmp_path / "fit_rank_0_summary.txt").read_bytes() == summary
    # AND in its own folder the second run trains
    own = {**second, "folder": "second"}
    _trainer(
        tmp_path, ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, trace_files=own), steps=3
    ).fit(model)
    assert model.calls == 3 and (tmp_path / "second" / "step_timeline_rank_0.json").is_file()
    # AND each run's traces carry its own run id (a profiler without memprofiler's callback)
    ids = {profiler_trace_run_id(p) for p in tmp_path.rglob("*.pt.trace.json")}
    assert len(ids) == 2 and None not in ids


def test_overwrite_never_rewrites_the_run_files_of_another_run_name(tmp_path):
    # GIVEN a first run whose traces carry `{run_name}` ("a") in dirpath
    names = {"filename": "{run_name}_{stage}_rank_{rank}.{cycle}.pt.trace.json", "overwrite": True}
    _trainer(
        tmp_path,
        ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, trace_files={**names, "run_name": "a"}),
        steps=3,
    ).fit(TinyModel())
    timeline = (tmp_path / "step_timeline_rank_0.json").read_bytes()
    summary = (tmp_path / "fit_rank_0_summary.txt").read_bytes()
    # WHEN a second run with another run name ("b") starts there with overwrite
    model = TinyModel()
    prof = ExtendedPyTorchProfiler(
        dirpath=tmp_path, schedule_cfg=CYCLE, trace_files={**names, "run_name": "b"}
    )
    # THEN it is refused in one line (the template's `{run_name}` matched "a" before, and the
    # first run's step timeline and summary were rewritten)
    with pytest.raises(
        ConfigError, match=r"traces are named otherwise \('a_fit_rank_0.1.pt.trace.json'\).*own folder"
    ):
        _trainer(tmp_path, prof, steps=3).fit(model)
    assert model.calls == 0
    assert (tmp_path / "step_timeline_rank_0.json").read_bytes() == timeline
    assert (tmp_path / "fit_rank_0_summary.txt").read_bytes() == summary
    # AND the same run name again replaces the run as `overwrite` says
    _trainer(
        tmp_path,
        ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, trace_files={**names, "run_name": "a"}),
        steps=3,
    ).fit(model)
    assert model.calls == 3


class _SleepyCallback(pl.Callback):
    """Sleeps a known time at the end of every training batch, and measures how long it slept."""

    SLEEP_S = 0.03

    def __init__(self) -> None:
        self.slept_ms: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        t0 = time.perf_counter_ns()
        time.sleep(self.SLEEP_S)
        self.slept_ms.append((time.perf_counter_ns() - t0) / 1e6)


class _SlowData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every item takes a known time to load (measured: a loaded host oversleeps)."""

    SLEEP_S = 0.02

    def __init__(self) -> None:
        self.slept_ms: list[float] = []

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter_ns()
        time.sleep(self.SLEEP_S)
        self.slept_ms.append((time.perf_counter_ns() - t0) / 1e6)
        return torch.ones(16), torch.zeros(1)


class _SlowDataModel(TinyModel):
    def __init__(self) -> None:
        super().__init__()
        self.data = _SlowData()

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        return DataLoader(self.data, batch_size=1)


def test_hook_and_dataloader_spans_have_the_known_durations(tmp_path):
    # GIVEN a callback sleeping 30 ms per batch end and a loader sleeping 20 ms per batch
    prof = ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, timeline={"host_interval_s": 0.05})
    steps = 8
    sleepy_cb, model = _SleepyCallback(), _SlowDataModel()
    t0 = time.time_ns()
    _trainer(tmp_path, prof, steps=steps, callbacks=[sleepy_cb]).fit(model)
    t1 = time.time_ns()
    timeline = json.loads((tmp_path / "step_timeline_rank_0.json").read_text())
    base = timeline["baseTimeNanoseconds"]
    # THEN every step has the callback's span: at least the sleep asked for, and within 5 ms of
    # the time the hook measured itself sleeping (a loaded host oversleeps; the span must follow)
    hooks = _spans(timeline, HOOK_TID)
    sleepy = hooks["[Callback]_SleepyCallback.on_train_batch_end"]
    durations_ms = [e["dur"] / 1000 for e in sleepy]
    assert len(sleepy) == steps
    assert min(durations_ms) >= _SleepyCallback.SLEEP_S * 1000
    excess = [d - slept for d, slept in zip(durations_ms, sleepy_cb.slept_ms, strict=True)]
    assert all(x >= 0 for x in excess) and statistics.median(excess) < 5
    # AND the spans lie inside the run, on the shared epoch clock
    assert all(t0 <= base + e["ts"] * 1000 <= t1 for e in sleepy)
    # AND each batch's wait for the loader is one span on the data-loader row, at least the sleep
    waits = _spans(timeline, DATA_TID)["[_TrainingEpochLoop].train_dataloader_next"]
    wait_ms = [e["dur"] / 1000 for e in waits]
    assert len(waits) == steps
    assert min(wait_ms) >= _SlowData.SLEEP_S * 1000
    loaded = model.data.slept_ms[:steps]  # a sized loader: no prefetch, one item per wait
    excess = [w - slept for w, slept in zip(wait_ms, loaded, strict=True)]
    assert all(x >= 0 for x in excess) and statistics.median(excess) < 5
    # AND the training step is timed too, and the host counters were sampled during the run
    assert len(hooks["[Strategy]SingleDeviceStrategy.training_step"]) == steps
    assert not [n for n in hooks if "_FlushOnException" in n]  # the profiler's own helper is left out
    host = [e for e in timeline["traceEvents"] if e.get("ph") == "C"]
    assert {e["name"] for e in host} >= {"host.cpu_percent", "process.rss", "host.memory_used"}
    assert all(t0 <= base + e["ts"] * 1000 <= t1 for e in host)
    assert all(e["args"]["value"] > 0 for e in host if e["name"] == "process.rss")


def test_the_cycle_trace_holds_the_steps_hooks_and_host_counters(tmp_path):
    # GIVEN one cycle (step 2) and a fast sampler
    prof = ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, timeline={"host_interval_s": 0.02})
    _trainer(tmp_path, prof, steps=3, callbacks=[_SleepyCallback()]).fit(TinyModel())
    trace = json.loads((tmp_path / "fit_rank_0.1.pt.trace.json").read_text())
    # THEN the traced step's hooks are on their own row, inside the trace's span and beside Kineto's events
    step = next(e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#2")
    sleepy = _spans(trace, HOOK_TID)["[Callback]_SleepyCallback.on_train_batch_end"]
    assert any(step["ts"] <= e["ts"] <= step["ts"] + step["dur"] for e in sleepy)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"lightning hooks", "data loader"} <= names
    assert any(e.get("ph") == "C" and e.get("cat") == "memprofiler.host" for e in trace["traceEvents"])


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "memprofiler-host-sampler"]


def test_sampler_stops_when_training_raises(tmp_path):
    prof = ExtendedPyTorchProfiler(dirpath=tmp_path, schedule_cfg=CYCLE, timeline={"host_interval_s": 0.02})
    with pytest.raises(RuntimeError, match="injected failure"):
        _trainer(tmp_path, prof, steps=6).fit(TinyModel(fail_at=3))
    assert not _sampler_threads()
    timeline = json.loads((tmp_path / "step_timeline_rank_0.json").read_text())
    assert any(e.get("ph") == "C" for e in timeline["traceEvents"])


@pytest.mark.slow
def test_sampler_stops_and_timeline_is_written_on_sigterm(tmp_path):
    # GIVEN a training process that sends itself SIGTERM in its 4th step
    script = textwrap.dedent(
        f"""
        import atexit, os, threading, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import lightning.pytorch as pl
        from _tiny_lightning import TinyModel
        from memprofiler import ExtendedPyTorchProfiler

        class Model(TinyModel):
            def training_step(self, batch, batch_idx):
                if batch_idx == 3:
                    os.kill(os.getpid(), 15)
                return super().training_step(batch, batch_idx)

        def report():
            alive = [t.name for t in threading.enumerate() if t.name == "memprofiler-host-sampler"]
            print("SAMPLERS", alive, flush=True)

        atexit.register(report)
        prof = ExtendedPyTorchProfiler(dirpath={str(tmp_path)!r}, schedule_cfg={{"wait": 1, "warmup": 1, "active": 5}},
                                       timeline={{"host_interval_s": 0.02}})
        pl.Trainer(default_root_dir={str(tmp_path)!r}, max_steps=10, profiler=prof, logger=False, accelerator="cpu",
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(Model())
        """
    )
    # WHEN it runs
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=subprocess_env()
    )
    # THEN it ended (by Lightning's SIGTERM handling) with no sampler thread left, and the files are valid
    assert "SAMPLERS []" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    timeline = json.loads((tmp_path / "step_timeline_rank_0.json").read_text())
    assert len(_spans(timeline, HOOK_TID)["[Strategy]SingleDeviceStrategy.training_step"]) == 4
    trace = json.loads((tmp_path / "fit_rank_0.1.pt.trace.json").read_text())
    assert any(e.get("name") == "ProfilerStep#2" for e in trace["traceEvents"])


def test_merge_traces_folds_in_gzip_traces_with_custom_names_and_the_step_timeline(tmp_path):
    from memprofiler.analysis.traces.merge import (
        find_profiler_traces,
        find_rank_traces,
        find_step_timelines,
        merge_rank_traces,
    )

    # GIVEN a run whose trace names carry no rank, gzip-compressed, with memprofiler
    prof = ExtendedPyTorchProfiler(
        schedule_cfg=CYCLE, trace_files={"filename": "ba{batch}.pt.trace.json", "use_gzip": True}
    )
    cb = MemProfilerCallback({"schedule": {"follow_profiler": True}})
    _trainer(tmp_path, prof, steps=4, callbacks=[cb]).fit(TinyModel())
    run = tmp_path / "memprofiler"
    # WHEN every file of the run is merged
    profiler = find_profiler_traces(run)
    steps = find_step_timelines(run)
    assert profiler == {0: [run / "ba2.pt.trace.json.gz"]}  # the rank read from inside the file
    merged = merge_rank_traces(find_rank_traces(run), profiler, steps)
    # THEN one rank holds Kineto's step, memory spans, and each hook span once (the cycle's copy dropped)
    events = merged["traceEvents"]
    assert {e["pid"] for e in events} == {0}
    assert any(e.get("name") == "ProfilerStep#2" for e in events)
    train_steps = _spans(merged, HOOK_TID)["[Strategy]SingleDeviceStrategy.training_step"]
    assert len(train_steps) == 4
    assert any(e.get("cat") == "memprofiler.host" for e in events)


def test_a_url_dirpath_writes_straight_to_the_store_and_keeps_the_newest(tmp_path, s3_bucket):
    # GIVEN no memprofiler callback, dirpath on a real S3 server, keep 1 of 3 cycles
    prof = ExtendedPyTorchProfiler(
        dirpath=f"{s3_bucket}/traces",
        schedule_cfg={**CYCLE, "repeat": 3},
        trace_files={"num_traces_to_keep": 1},
    )
    # WHEN training runs
    _trainer(tmp_path, prof, steps=9).fit(TinyModel())
    # THEN the store holds the last cycle's trace, the summary and the step timeline only
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3_bucket[len('s3://') :]}/traces", refresh=True))
    assert names == ["fit_rank_0.3.pt.trace.json", "fit_rank_0_summary.txt", "step_timeline_rank_0.json"]
