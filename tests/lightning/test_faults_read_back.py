"""Every file kind memprofiler writes, written under injected psutil faults, is read back by
``memprofiler report``: a metric that cannot be read is dropped with one warning, training
goes on, and no ``null``/``NaN`` reaches a file."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from _tiny_lightning import TinyModel
from _tiny_lightning import quiet_trainer as _trainer
from memprofiler import ExtendedPyTorchProfiler, MemProfilerCallback
from memprofiler.__main__ import main
from memprofiler.analysis.runs.ids import profiler_trace_run_id


def _strict_json(path: Path) -> Any:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)

    def refuse(name: str) -> None:
        raise AssertionError(f"{path.name} holds {name}")

    return json.loads(raw, parse_constant=refuse)


def _no_none_in_counters(trace: dict[str, Any], where: str) -> None:
    for event in trace["traceEvents"]:
        if isinstance(event, dict) and event.get("ph") == "C":
            for key, value in event.get("args", {}).items():
                assert isinstance(value, (int, float)), f"{where}: counter {event['name']}.{key} = {value!r}"


def test_every_file_written_under_psutil_faults_is_valid_and_reported(tmp_path, monkeypatch):
    # GIVEN a locked-down /proc: the process entry refuses to be read (RSS, process CPU), the
    # host memory percent comes back NaN and the disk counters fail from the third read on
    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "/proc/self/stat")

    real_vm = psutil.virtual_memory

    class NanPercent:
        def __init__(self) -> None:
            vm = real_vm()
            self.total, self.available, self.percent = vm.total, vm.available, float("nan")

    disk_reads = iter(range(1_000_000))
    real_disk = psutil.disk_io_counters

    def disk(*args: object, **kwargs: object) -> Any:
        if next(disk_reads) >= 2:
            raise PermissionError("/proc/diskstats")
        return real_disk()

    monkeypatch.setattr(psutil, "Process", denied)
    monkeypatch.setattr(psutil, "virtual_memory", NanPercent)
    monkeypatch.setattr(psutil, "disk_io_counters", disk)
    # a profiler and memprofiler, every file kind on: stats YAML, memory trace, manifest,
    # profiler trace (gzip'd), memory categories, step timeline with host rows, summary
    prof = ExtendedPyTorchProfiler(
        schedule_cfg={"wait": 1, "warmup": 1, "active": 2},
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
        trace_files={"use_gzip": True},
        timeline={"host_interval_s": 0.01},
    )
    model = TinyModel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(
            tmp_path,
            prof,
            steps=6,
            callbacks=[
                MemProfilerCallback(
                    {
                        "schedule": {"follow_profiler": True},
                        "dump_memorystats_pickle": True,
                    }
                )
            ],
        ).fit(model)
    # THEN training ran every step
    assert model.calls == 6
    # AND each dropped metric was named once, in one line
    lines = [
        str(w.message)
        for w in caught
        if "host sampler" in str(w.message) or "PermissionError" in str(w.message)
    ]
    assert all("\n" not in line for line in lines)
    for needle in ("cannot read cpu", "cannot read rss", "cannot read disk", "host.memory_percent read nan"):
        assert sum(needle in line for line in lines) == 1, (needle, lines)
    # AND every file is valid, with no null or NaN counter
    run = tmp_path / "memprofiler"
    names = sorted(p.name for p in run.iterdir())
    kinds = {
        "stats": "rank_0_memory_stats.yaml",
        "memory trace": "memory_trace_rank_0.json",
        "profiler trace": "fit_rank_0.1.pt.trace.json.gz",
        "categories": "fit_rank_0.1.memory_categories.json.gz",
        "step timeline": "step_timeline_rank_0.json",
        "summary": "fit_rank_0_summary.txt",
        "stats pickle": "rank_0_memory_stats.pickle",
    }
    assert set(kinds.values()) <= set(names), names
    stats = yaml.safe_load((run / kinds["stats"]).read_text())
    assert sorted(stats) == [f"0.training_step.{n}.{p}" for n in (3, 4) for p in ("end", "start")]
    for name in names:
        if ".json" in name:
            data = _strict_json(run / name)
            if isinstance(data, dict) and "traceEvents" in data:
                _no_none_in_counters(data, name)
    timeline = _strict_json(run / kinds["step timeline"])
    host = {e["name"] for e in timeline["traceEvents"] if e.get("cat") == "memprofiler.host"}
    assert {"host.memory_used", "host.net_sent"} <= host
    assert not host & {"host.memory_percent", "process.rss", "process.cpu_percent", "host.cpu_percent"}
    # AND the profiler's traces carry the run's id, memprofiler's (in the manifest)
    run_id = yaml.safe_load((run / "memprofiler_run.yaml").read_text())["run_id"]
    assert profiler_trace_run_id(run / kinds["profiler trace"]) == run_id
    # AND memprofiler reads back what it wrote: the run report and the profiler views
    assert main(["report", str(run), "-o", str(tmp_path / "r.html"), "--traces", str(run)]) == 0
    assert (tmp_path / "r.html").stat().st_size > 0


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_a_full_disk_keeps_the_trace_cycles_written_before_with_one_warning(tmp_path, disk, monkeypatch):
    # GIVEN three trace cycles, the disk full once the first is written
    real = ExtendedPyTorchProfiler._on_trace_ready

    def then_fill(self: ExtendedPyTorchProfiler, prof: Any) -> None:
        real(self, prof)
        disk.left = 0

    monkeypatch.setattr(ExtendedPyTorchProfiler, "_on_trace_ready", then_fill)
    prof = ExtendedPyTorchProfiler(
        dirpath=tmp_path, schedule_cfg={"wait": 1, "warmup": 1, "active": 1, "repeat": 3}
    )
    model = TinyModel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(tmp_path, prof, steps=8).fit(model)
    # THEN training ran, one line said the disk is full, cycle 1 is whole and the only one
    assert model.calls == 8
    full = [str(w.message) for w in caught if "full" in str(w.message) or "No space" in str(w.message)]
    assert len(full) == 1 and "disk is full" in full[0] and "from cycle 2 on" in full[0], full
    assert sorted(p.name for p in tmp_path.glob("*.pt.trace.json")) == ["fit_rank_0.1.pt.trace.json"]
    trace = _strict_json(tmp_path / "fit_rank_0.1.pt.trace.json")
    assert [e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")][:1]
    assert _strict_json(tmp_path / "step_timeline_rank_0.json")["traceEvents"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_torch_failing_to_list_events_at_teardown_does_not_fail_the_fit(tmp_path):
    # GIVEN the profiler's memory options with memprofiler's module-wise tracker: torch's
    # `profile.events()` at teardown raises UnicodeDecodeError on a garbled event name
    # (torch 2.13 CPU; the byte differs run to run)
    prof = ExtendedPyTorchProfiler(
        schedule_cfg={"wait": 1, "warmup": 1, "active": 2},
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    )
    callback = MemProfilerCallback(
        {
            "schedule": {"follow_profiler": True},
            "track_module_mem": True,
            "collect_funcs": {"module_mem": ["training_step"]},
        }
    )
    model = TinyModel()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        # WHEN trained THEN fit returns (a fault is a warning), and the cycle's trace is whole
        _trainer(tmp_path, prof, steps=6, callbacks=[callback]).fit(model)
    assert model.calls == 6
    assert _strict_json(tmp_path / "memprofiler" / "fit_rank_0.1.pt.trace.json")["traceEvents"]
