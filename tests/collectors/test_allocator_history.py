"""CUDA allocator history on the schedule's window, through the fake CUDA seam (and on a GPU)."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from torch import nn

from _scripts import load_script
from conftest import make_trainer, step_trainer
from fake_cuda import SEGMENT_ADDR, FakeCudaBackend, load_fixture
from memprofiler import MemProfiler, MemProfilerCallback, memprofilable
from memprofiler.analysis.snapshot.calls import call_ranges, call_view, find_call
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.collectors.history_recording import HistoryOptions, HistoryRecording
from memprofiler.config import MemProfilerConfig, ScheduleConfig
from memprofiler.core.schedule import Action, action
from memprofiler.core.warn import MemProfilerWarning
from memprofiler.errors import ArtifactError, ConfigError

KIB = 1024


def _cfg(schedule: dict, **extra) -> dict:
    return {
        "schedule": schedule,
        "cuda_allocator_history": True,
        "enable_saved_tensors_hooks": False,
        "collect_funcs": {"default": ["train_step"]},
        **extra,
    }


def _run_loop(prof: MemProfiler, fake: FakeCudaBackend, calls: int, fn: str = "train_step") -> list[bool]:
    """Call ``fn`` ``calls`` times; each call allocates and frees ``call * 4 KiB``.

    Returns whether history was being recorded inside each call.
    """
    recording = []
    for n in range(1, calls + 1):
        with prof.profile(fn):
            addr = fake.alloc(n * 4 * KIB)
            fake.free(addr)
            recording.append(fake.ring is not None)
    return recording


def _alloc_files(save_dir: Path) -> list[str]:
    return sorted(p.name for p in save_dir.glob("cuda_alloc_rank_*"))


def _window_files(n_windows: int, rank: int = 0) -> list[str]:
    return sorted(
        f"cuda_alloc_rank_{rank}.window_{n}.{ext}" for n in range(n_windows) for ext in ("pickle", "json")
    )


def _load(path: Path) -> dict:
    data = path.read_bytes()
    assert data[:2] == b"\x80\x04", f"{path.name} is not pickle protocol 4"
    return pickle.loads(data)


def _index(save_dir: Path, n: int = 0, rank: int = 0) -> dict:
    return json.loads((save_dir / f"cuda_alloc_rank_{rank}.window_{n}.json").read_text())


def _windows(sched: ScheduleConfig, calls: int) -> int:
    """Maximal runs of consecutive calls the schedule warms up or collects."""
    active = [action(sched, n) is not Action.NONE for n in range(1, calls + 1)]
    return sum(1 for on, _ in itertools.groupby(active) if on)


# ----------------------------------------------------------------------------- config
def test_config_defaults_and_errors():
    # GIVEN the defaults
    cfg = MemProfilerConfig()
    # THEN history is off, bounded at 100k, python stacks, all contexts
    assert cfg.cuda_allocator_history is False
    assert (cfg.allocator_history.max_entries, cfg.allocator_history.stacks) == (100_000, "python")
    assert cfg.allocator_history.context == "all"
    # AND wrong values name the dotted key and the allowed values
    with pytest.raises(ConfigError, match=r"`allocator_history.stacks`: got 'cpp'; allowed: python, all"):
        MemProfilerConfig.from_any({"allocator_history": {"stacks": "cpp"}})
    with pytest.raises(ConfigError, match=r"`allocator_history.max_entries`: got 0"):
        MemProfilerConfig.from_any({"allocator_history": {"max_entries": 0}})
    with pytest.raises(ConfigError, match=r"`allocator_history.context`: got 'none'"):
        MemProfilerConfig.from_any({"allocator_history": {"context": "none"}})
    # AND `context: null` (no tracebacks) is accepted, as torch accepts None
    assert (
        MemProfilerConfig.from_any({"allocator_history": {"context": None}}).allocator_history.context is None
    )


# ----------------------------------------------------------------------------- window
SCHEDULES = [
    {"warmup": 1, "active": 1, "repeat": 1},
    {"warmup": 0, "active": 2, "repeat": 1},
    {"wait": 1, "warmup": 1, "active": 2, "repeat": 2},
    {"skip_first": 2, "wait": 2, "warmup": 0, "active": 1, "repeat": 0},
    {"wait": 0, "warmup": 1, "active": 1, "repeat": 3},
    {"warmup_iters": 2, "max_iter": 4},
]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_recording_runs_exactly_on_warmup_and_collected_calls(tmp_path, schedule):
    # GIVEN a profiler with allocator history on, over the fake allocator
    fake = FakeCudaBackend()
    prof = MemProfiler(_cfg(schedule), save_dir=tmp_path, rank=0, cuda=fake)
    sched = prof.config.schedule
    calls = 12
    # WHEN a function is called 12 times
    with prof:
        recording = _run_loop(prof, fake, calls)
    # THEN history is recorded inside exactly the warmup and collected calls
    expected = [action(sched, n) is not Action.NONE for n in range(1, calls + 1)]
    assert recording == expected
    # AND each window is one start and one stop (enabled=None), nothing is left running
    opts = {"context": "all", "stacks": "python", "max_entries": 100_000}
    assert fake.history_calls == [("all", opts), (None, {})] * _windows(sched, calls)
    assert fake.ring is None
    # AND there is one recording (and its index) per window, each call marked in it once
    assert _alloc_files(tmp_path) == _window_files(_windows(sched, calls))
    collected = [n for n in range(1, calls + 1) if action(sched, n).collects]
    marked = [c["call"] for w in range(_windows(sched, calls)) for c in _index(tmp_path, w)["calls"]]
    assert marked == collected
    assert fake.marks == [f"memprofiler:train_step:{n}" for n in collected]
    # AND snapshots were one per window, when it closed, and the ring's look one call into a
    # part; never one at a call's start and end (2 per collected call) as before
    probes = sum(len(_index(tmp_path, w)["calls"]) > 1 for w in range(_windows(sched, calls)))
    assert fake.snapshots_taken == _windows(sched, calls) + probes < 2 * len(collected) + 1


def _old_style_run(prof: MemProfiler, fake: FakeCudaBackend, calls: int) -> dict[tuple[int, str], dict]:
    """Train ``calls`` calls that keep memory across calls, and take the snapshot the per-call
    collector used to write at the start and at the end of each call, from inside the call.

    Call n allocates (n KiB, kept until call n + 1 frees it) and a temporary of n * 4 KiB; a
    block allocated before recording began is freed in call 3.
    """
    old: dict[tuple[int, str], dict] = {}
    kept: list[int] = []
    early = fake.alloc(100 * KIB)  # before the window: no recording, no stack
    for n in range(1, calls + 1):
        with prof.profile("train_step"):
            if fake.ring is not None and n > 1:
                old[(n, "start")] = fake.snapshot()
            if kept:
                fake.free(kept.pop())
            if n == 3:
                fake.free(early)
            kept.append(fake.alloc(n * KIB))
            fake.free(fake.alloc(n * 4 * KIB))
            if fake.ring is not None and n > 1:
                old[(n, "end")] = fake.snapshot()
    return old


def _no_markers(snap: dict) -> dict:
    """A snapshot without the ``snapshot`` entries its own writing added to the trace."""
    out = dict(snap)
    out["device_traces"] = [[e for e in t if e["action"] != "snapshot"] for t in snap["device_traces"]]
    out.pop("external_annotations", None)
    return out


def test_every_per_call_view_equals_the_per_call_file_it_replaces(tmp_path):
    # GIVEN a window of calls 1 (warmup) to 4, over an allocator whose segments follow its trace
    fake = FakeCudaBackend(track_blocks=True)
    prof = MemProfiler(_cfg({"warmup": 1, "active": 3}), save_dir=tmp_path, rank=0, cuda=fake)
    # WHEN it trains, the snapshots the old collector wrote being taken in each call as well
    with prof:
        old = _old_style_run(prof, fake, 5)
    # THEN one recording was written for the window, with calls 2-4 marked in it
    assert _alloc_files(tmp_path) == _window_files(1)
    recording = load_snapshot(tmp_path / "cuda_alloc_rank_0.window_0.pickle")
    ranges = call_ranges(recording)
    assert [(r.fn, r.call) for r in ranges] == [("train_step", n) for n in (2, 3, 4)]
    # (and torch's own memory_viz tooling reads it as it is)
    from torch.cuda import _memory_viz

    assert "Active Memory Timeline" in _memory_viz.trace_plot(recording) and _memory_viz.segsum(recording)
    # AND every call's view at its start and end equals the file written there before
    for (n, phase), snap in old.items():
        view = call_view(recording, find_call(ranges, "train_step", n), phase)
        assert _no_markers(view) == _no_markers(snap), (n, phase)
        # (and so does what the analysis reads from it: peaks, the baseline, stacks, timeline)
        assert analyze(_no_markers(view)) == analyze(_no_markers(snap))
    # AND the views hold the known allocations: call 3's end view has its 3 KiB block live
    # and call 2's freed, its start view call 2's block live, the early block still alive
    end3 = call_view(recording, find_call(ranges, "train_step", 3), "end")
    (seg,) = [s for s in end3["segments"] if s["address"] == SEGMENT_ADDR]
    live = sorted(b["requested_size"] for b in seg["blocks"] if b["state"] != "inactive")
    assert live == [3 * KIB]
    start3 = call_view(recording, find_call(ranges, "train_step", 3), "start")
    (seg,) = [s for s in start3["segments"] if s["address"] == SEGMENT_ADDR]
    assert sorted(b["requested_size"] for b in seg["blocks"] if b["state"] != "inactive") == [
        2 * KIB,
        100 * KIB,
    ]
    # AND the stats YAML names the window each call was recorded in
    stats = yaml.safe_load((tmp_path / "rank_0_memory_stats.yaml").read_text())
    assert {stats[f"0.train_step.{n}.end"]["allocator_history.window"] for n in (2, 3, 4)} == {0}


def test_the_recording_is_written_at_flushes_and_when_a_call_raises(tmp_path):
    # GIVEN a long window (warmup 1, 6 collected) whose flushes may write the recording each time
    fake = FakeCudaBackend()
    cfg = _cfg({"warmup": 1, "active": 6}, flush_every_calls=1, flush_interval_s=1e-9)
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake)
    path = tmp_path / "cuda_alloc_rank_0.window_0.pickle"
    marked_on_disk = []
    with prof:
        for _ in range(4):
            with prof.profile("train_step"):
                fake.free(fake.alloc(KIB))
            marked_on_disk.append(len(call_ranges(_load(path))) if path.exists() else 0)
        # WHEN call 5 raises
        with pytest.raises(ValueError), prof.profile("train_step"):
            fake.alloc(7 * KIB)
            raise ValueError("boom")
        # THEN the recording on disk already holds it, up to the failure
        failed = call_ranges(_load(path))[-1]
        assert (failed.call, failed.end_us is not None) == (5, True)
        assert _load(path)["device_traces"][0][-1]["size"] == 7 * KIB
    # AND a process killed after any flush keeps the calls up to it (call 1 warms up)
    assert marked_on_disk == [0, 1, 2, 3]


def test_a_part_is_written_before_the_ring_wraps_past_its_first_call(tmp_path):
    # GIVEN a ring of 40 entries and a 20-call window, each call recording 9 entries
    fake = FakeCudaBackend()
    cfg = _cfg({"warmup": 0, "active": 20}, allocator_history={"max_entries": 40})
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake)
    with prof:
        for n in range(1, 21):
            with prof.profile("train_step"):
                for k in range(3):
                    fake.free(fake.alloc((100 * n + k) * 8))
    # THEN the window was written in parts, each holding every one of its calls in full
    parts = sorted(tmp_path.glob("cuda_alloc_rank_0.window_*.pickle"))
    assert len(parts) > 1
    seen = []
    for part in parts:
        recording = _load(part)
        index = _index(tmp_path, int(part.stem.rsplit("_", 1)[1]))
        for rng in call_ranges(recording, index):
            if rng.call in seen or rng.call not in [c["call"] for c in index["calls"]]:
                continue  # the next part's file still holds the end of this one's ring
            start = call_view(recording, rng, "start", ring_entries=index["ring_entries"])
            end = call_view(recording, rng, "end", ring_entries=index["ring_entries"])
            added = end["device_traces"][0][len(start["device_traces"][0]) :]
            assert [e["size"] for e in added if e["action"] == "alloc"] == [
                (100 * rng.call + k) * 8 for k in range(3)
            ]
            seen.append(rng.call)
    assert seen == list(range(1, 21))
    # AND at most one snapshot per call was taken (calls near half the ring), half the 40 of
    # per-call dumps
    assert fake.snapshots_taken <= 20


def test_calls_that_fill_half_the_ring_are_each_kept_whole(tmp_path):
    # GIVEN a ring of 40 entries and a 6-call window, each call recording 20 (half the ring)
    fake = FakeCudaBackend()
    cfg = _cfg({"warmup": 0, "active": 6}, allocator_history={"max_entries": 40})
    with MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake) as prof:
        for n in range(1, 7):
            with prof.profile("train_step"):
                for k in range(10):
                    fake.free(fake.alloc((100 * n + k) * 8))
    # THEN every call's start and end are in a recording, with all of its allocations (the
    # starts of every other call were lost before: two calls filled the ring)
    whole = {}
    for part in sorted(tmp_path.glob("cuda_alloc_rank_0.window_*.pickle")):
        recording = _load(part)
        index = _index(tmp_path, int(part.stem.rsplit("_", 1)[1]))
        for rng in call_ranges(recording, index):
            if rng.start_us is None or rng.end_us is None or rng.call in whole:
                continue
            try:
                start = call_view(recording, rng, "start", ring_entries=index["ring_entries"])
            except ArtifactError:
                continue  # the ring no longer holds its start in this file
            end = call_view(recording, rng, "end", ring_entries=index["ring_entries"])
            added = end["device_traces"][0][len(start["device_traces"][0]) :]
            whole[rng.call] = [e["size"] for e in added if e["action"] == "alloc"]
    assert whole == {n: [(100 * n + k) * 8 for k in range(10)] for n in range(1, 7)}


def test_max_entries_bounds_the_ring_in_the_pickles(tmp_path):
    # GIVEN a ring of 5 entries and two collected calls of 10 alloc/free pairs each
    fake = FakeCudaBackend()
    cfg = _cfg({"warmup": 0, "active": 2}, allocator_history={"max_entries": 5, "stacks": "all"})
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake)
    with prof:
        for _ in range(2):
            with prof.profile("train_step"):
                for i in range(10):
                    fake.free(fake.alloc((i + 1) * KIB))
    # THEN the options reached the allocator and every pickle holds at most the newest 5
    assert fake.history_calls[0] == ("all", {"context": "all", "stacks": "all", "max_entries": 5})
    end = _load(tmp_path / "cuda_alloc_rank_0.window_0.pickle")
    trace = end["device_traces"][0]
    assert len(trace) == 5
    # (the newest 5: the 9 KiB free, the 10 KiB alloc and its free)
    assert [e["action"] for e in trace] == [
        "free_requested",
        "free_completed",
        "alloc",
        "free_requested",
        "free_completed",
    ]
    assert [e["size"] for e in trace] == [9 * KIB, 9 * KIB, 10 * KIB, 10 * KIB, 10 * KIB]


def _recording_after_each(prof: MemProfiler, fake: FakeCudaBackend, order: list[str]) -> list[bool]:
    out = []
    for fn in order:
        with prof.profile(fn):
            fake.free(fake.alloc(KIB))
        out.append(fake.ring is not None)
    return out


def test_recording_stays_on_until_the_last_open_window_closes(tmp_path):
    # GIVEN history for train_step (default) and val_step, default schedule for both
    fake = FakeCudaBackend()
    cfg = _cfg({}, collect_funcs={"default": ["train_step"], "cuda_allocator_history": ["val_step"]})
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake)
    # WHEN their windows interleave: t1 (warmup) v1 (warmup) t2 (collect, closes) v2 (collect, closes)
    with prof:
        on_after = _recording_after_each(prof, fake, ["train_step", "val_step", "train_step", "val_step"])
    # THEN train_step's window closing does not stop the recording val_step's window needs
    assert on_after == [True, True, True, False]
    # AND the recording was started once, stopped once and written once, both calls marked in it
    assert [c[0] for c in fake.history_calls] == ["all", None]
    assert _alloc_files(tmp_path) == _window_files(1)
    ranges = call_ranges(_load(tmp_path / "cuda_alloc_rank_0.window_0.pickle"))
    assert [(r.fn, r.call) for r in ranges] == [("train_step", 2), ("val_step", 2)]


def test_separate_windows_of_two_functions_record_separately(tmp_path):
    # GIVEN two functions whose windows do not overlap: a1 a2 b1 b2
    fake = FakeCudaBackend()
    prof = MemProfiler(_cfg({}, collect_funcs={"default": ["a", "b"]}), save_dir=tmp_path, rank=0, cuda=fake)
    with prof:
        on_after = _recording_after_each(prof, fake, ["a", "a", "b", "b"])
    # THEN recording stops between them: two starts, two stops
    assert on_after == [True, False, True, False]
    assert [c[0] for c in fake.history_calls] == ["all", None, "all", None]
    assert _alloc_files(tmp_path) == _window_files(2)
    assert [c["fn"] for n in (0, 1) for c in _index(tmp_path, n)["calls"]] == ["a", "b"]


def test_users_own_recording_is_left_alone_and_reported_once(tmp_path):
    # GIVEN the user already records history
    fake = FakeCudaBackend()
    fake.user_starts_recording(max_entries=1000)
    prof = MemProfiler(_cfg({"warmup": 1, "active": 1, "repeat": 2}), save_dir=tmp_path, rank=0, cuda=fake)
    # WHEN two windows are collected
    with pytest.warns(MemProfilerWarning, match="already on") as record, prof:
        _run_loop(prof, fake, 4)
    # THEN memprofiler never re-configured or stopped it, and said so once
    assert fake.history_calls == []
    assert fake.ring is not None and fake.options["max_entries"] == 1000
    assert sum("already on" in str(w.message) for w in record) == 1
    # AND the recording of the window (calls 1-4: warmups and collected calls in a row) is
    # still written from the user's recording, both collected calls marked in it
    assert _alloc_files(tmp_path) == _window_files(1)
    assert [r.key for r in call_ranges(_load(tmp_path / "cuda_alloc_rank_0.window_0.pickle"))] == [
        "train_step:2",
        "train_step:4",
    ]


def test_rank_is_in_the_file_names(tmp_path):
    fake = FakeCudaBackend()
    with MemProfiler(_cfg({}), save_dir=tmp_path, rank=3, cuda=fake) as prof:
        _run_loop(prof, fake, 2)
    assert _alloc_files(tmp_path) == _window_files(1, rank=3)
    assert _index(tmp_path, 0, rank=3)["rank"] == 3


def test_no_cuda_warns_once_and_training_goes_on(tmp_path):
    # GIVEN no CUDA device
    fake = FakeCudaBackend()
    fake.available = False
    prof = MemProfiler(
        _cfg({}, collect_funcs={"default": ["train_step"]}), save_dir=tmp_path, rank=0, cuda=fake
    )
    # WHEN the profiler runs
    with pytest.warns(MemProfilerWarning, match="`cuda_allocator_history` is off"), prof:
        for _ in range(3):
            with prof.profile("train_step"):
                pass
    # THEN nothing is recorded, no pickles are written, host metrics still are
    assert fake.history_calls == [] and _alloc_files(tmp_path) == []
    stats = yaml.safe_load((tmp_path / "rank_0_memory_stats.yaml").read_text())
    assert stats["0.train_step.2.end"]["rss"] > 0


def test_cpu_torch_build_is_guarded(tmp_path):
    # GIVEN the real backend on this machine's torch
    real = CudaBackend()
    if torch.cuda.is_available():
        pytest.skip("checks the CPU build")
    # THEN the missing bindings are reported, not called
    assert real.supports_history() is False
    assert real.supports_oom_observer() is False
    assert real.is_history_enabled() is None
    # AND a profiler asking for history and the OOM recorder warns and carries on
    cfg = _cfg({}, oom={"enabled": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MemProfiler(cfg, save_dir=tmp_path, rank=0) as prof:
            for _ in range(2):
                with prof.profile("train_step"):
                    torch.ones(4)
    messages = [str(w.message) for w in caught]
    assert any("`cuda_allocator_history` is off" in m for m in messages)
    assert any("OOM flight recorder" in m for m in messages)
    assert (tmp_path / "rank_0_memory_stats.yaml").is_file()


def test_snapshot_failure_switches_history_off_and_stops_recording(tmp_path):
    # GIVEN an allocator whose snapshot fails
    fake = FakeCudaBackend()
    fake.fail_snapshot = RuntimeError("driver went away")
    prof = MemProfiler(_cfg({"warmup": 1, "active": 2}), save_dir=tmp_path, rank=0, cuda=fake)
    # WHEN the window closes
    with pytest.warns(MemProfilerWarning, match="`cuda_allocator_history` failed in end"), prof:
        _run_loop(prof, fake, 4)
    # THEN recording was stopped at once instead of running on, and training went on
    assert [c[0] for c in fake.history_calls] == ["all", None]
    assert fake.ring is None
    stats = yaml.safe_load((tmp_path / "rank_0_memory_stats.yaml").read_text())
    assert set(stats) == {f"0.train_step.{n}.{p}" for n in (2, 3) for p in ("start", "end")}


def test_history_and_oom_ring_share_one_recording(tmp_path):
    # GIVEN an OOM ring of 50 entries and window history of 1000
    fake = FakeCudaBackend()
    cfg = _cfg({}, allocator_history={"max_entries": 1000}, oom={"enabled": True, "max_entries": 50})
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake)
    # WHEN a window opens and closes
    with prof:
        _run_loop(prof, fake, 3)
    # THEN the ring runs from set-up at the larger planned size, is never resized while it
    # records (the allocator would scramble a wrapped ring), and stops at teardown
    assert [(e, o.get("max_entries")) for e, o in fake.history_calls] == [("all", 1000), (None, None)]


def test_window_pickles_stay_in_order_after_the_oom_ring_has_wrapped(tmp_path):
    # GIVEN an OOM ring of 8 and window history of 16 that sets up at the same time
    fake = FakeCudaBackend()
    cfg = _cfg(
        {"warmup": 0, "wait": 3},
        allocator_history={"max_entries": 16},
        oom={"enabled": True, "max_entries": 8},
    )
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake)
    # WHEN 3 waiting calls wrap the ring many times over, then the collected call 4 frees
    # one 10 KiB allocation
    with prof:
        for n in range(4):
            with prof.profile("train_step"):
                for i in range(10 if n < 3 else 1):
                    fake.free(fake.alloc(10 * KIB if n == 3 else (i + 1) * KIB))
    # THEN the end pickle of call 4 is full and strictly in time order, its newest entry being
    # the free of call 4's allocation
    trace = _load(tmp_path / "cuda_alloc_rank_0.window_0.pickle")["device_traces"][0]
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)
    assert len(trace) == 16
    assert (trace[-1]["action"], trace[-1]["size"]) == ("free_completed", 10 * KIB)


def test_a_holder_wanting_a_bigger_live_ring_gets_one_warning_not_a_resize():
    # GIVEN a ring started by one holder without the other having planned
    fake = FakeCudaBackend()
    msgs: list[str] = []
    rec = HistoryRecording(fake, msgs.append)
    rec.acquire("a", HistoryOptions(10, "python", "all"))
    # WHEN a second holder wants more, twice
    rec.acquire("b", HistoryOptions(20, "python", "all"))
    rec.acquire("c", HistoryOptions(30, "python", "all"))
    # THEN the ring keeps its size and the user is told once, with the keys to set
    assert fake.ring is not None and fake.ring.max_entries == 10
    assert [o["max_entries"] for _, o in fake.history_calls] == [10]
    assert len(msgs) == 1 and "`oom.max_entries`" in msgs[0] and "max_entries=20" in msgs[0]
    # AND once everyone leaves, the next start sizes the ring afresh
    rec.release_all()
    rec.acquire("c", HistoryOptions(30, "python", "all"))
    assert fake.ring.max_entries == 30


def test_recording_merges_options_of_holders():
    # GIVEN two holders with different wishes, both planned
    fake = FakeCudaBackend()
    rec = HistoryRecording(fake, lambda m: None)
    a, b = HistoryOptions(10, "python", "alloc"), HistoryOptions(5, "all", "state")
    rec.plan(a)
    rec.plan(b)
    rec.acquire("b", b)
    # THEN the ring starts at the largest planned size
    assert fake.options == {"max_entries": 10, "stacks": "all", "context": "state"}
    rec.acquire("a", a)
    # AND the allocator gets the least options that satisfy both
    assert fake.options == {"max_entries": 10, "stacks": "all", "context": "alloc"}
    # WHEN one leaves, the other's stacks and context return at the same ring size
    rec.release("a")
    assert fake.options == {"max_entries": 10, "stacks": "all", "context": "state"}
    assert rec.ring_entries == 10
    # AND the last one out stops
    rec.release("b")
    assert fake.ring is None and not rec.recording and rec.ring_entries is None
    # AND releasing an unknown holder is a no-op
    rec.release("c")
    assert len(fake.history_calls) == 4


# ----------------------------------------------------------------------------- Lightning
class _Steps(pl.LightningModule):
    def __init__(self, fake: FakeCudaBackend) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fake = fake

    @memprofilable
    def training_step(self, batch, batch_idx):
        # A known allocation inside the step: (batch_idx + 1) MiB on the fake device.
        self.fake.free(self.fake.alloc((batch_idx + 1) << 20))
        return self.layer(batch[0]).sum()

    def train_dataloader(self):
        ds = torch.utils.data.TensorDataset(torch.randn(6, 4))
        return torch.utils.data.DataLoader(ds, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_trainer_writes_pickles_of_the_collected_steps(tmp_path):
    # GIVEN the callback with history on for steps 2-3, over the fake allocator
    fake = FakeCudaBackend()
    cfg = {"schedule": {"warmup": 1, "active": 2}, "cuda_allocator_history": True}
    cb = MemProfilerCallback({**cfg, "save_dir": str(tmp_path / "mp")}, cuda=fake)
    # WHEN five steps train
    step_trainer(tmp_path, [cb], 5).fit(_Steps(fake))
    # THEN steps 1-3 are one recording; recording ran from step 1 to the end of step 3
    assert _alloc_files(tmp_path / "mp") == _window_files(1)
    assert [c[0] for c in fake.history_calls] == ["all", None]
    recording = _load(tmp_path / "mp" / "cuda_alloc_rank_0.window_0.pickle")
    ranges = call_ranges(recording)
    assert [r.key for r in ranges] == ["training_step:2", "training_step:3"]
    # AND step 3's end view holds the 1, 2 and 3 MiB allocations of steps 1-3, not 4 or 5,
    # and its start view those of steps 1-2
    for phase, mib in (("end", [1, 2, 3]), ("start", [1, 2])):
        view = call_view(recording, find_call(ranges, "training_step", 3), phase)
        sizes = [e["size"] for e in view["device_traces"][0] if e["action"] == "alloc"]
        assert sizes == [m << 20 for m in mib]


# ----------------------------------------------------------------------------- GPU
class _CudaMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))

    @memprofilable
    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 64)), batch_size=8)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())


@pytest.mark.cuda
def test_gpu_pickles_are_real_memory_viz_snapshots(tmp_path):
    from torch.cuda import _memory_viz

    # GIVEN a small model training on CUDA with history for step 3, its window opening at call 2
    # (after the first optimizer step made Adam's state: on the H200 a window opening at call 1
    # found only the parameters alive, as it should)
    cfg = {"cuda_allocator_history": True, "save_dir": str(tmp_path), "schedule": {"skip_first": 1}}
    cb = MemProfilerCallback(cfg)
    trainer = make_trainer(tmp_path, [cb], max_steps=4, accelerator="cuda")
    trainer.fit(_CudaMLP())
    recording = _load(tmp_path / "cuda_alloc_rank_0.window_0.pickle")
    # THEN the allocator kept memprofiler's marks of call 3, on the trace's clock
    ranges = call_ranges(recording)
    assert [r.key for r in ranges] == ["training_step:3"] and ranges[0].source == "annotation"
    start = call_view(recording, ranges[0], "start")
    end = call_view(recording, ranges[0], "end")
    # THEN the traces hold allocs and completed frees with Python frames
    trace = end["device_traces"][torch.cuda.current_device()]
    actions = {e["action"] for e in trace}
    assert {"alloc", "free_completed"} <= actions
    assert any(f["filename"].endswith(".py") for e in trace if e["action"] == "alloc" for f in e["frames"])
    # AND the start pickle has fewer entries than the end pickle
    assert sum(map(len, start["device_traces"])) < sum(map(len, end["device_traces"]))
    # AND torch's own memory_viz tooling reads them
    assert "entries" in _memory_viz.trace(recording)
    assert _memory_viz.segsum(recording)
    assert "Active Memory Timeline" in _memory_viz.trace_plot(recording)
    # AND the parameters and optimizer state alive before the window are named in its index
    roles = {r["role"] for r in _index(tmp_path)["roles"]}
    assert {"parameter", "optimizer state"} <= roles
    # AND recording is off after the window
    assert torch._C._cuda_isHistoryEnabled() is False


@pytest.mark.cuda
def test_record_real_fixture(tmp_path):
    # GIVEN a tiny real step recorded on the GPU
    torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=200)
    try:
        lin = nn.Linear(256, 256).cuda()
        x = torch.randn(64, 256, device="cuda")
        lin(x).sum().backward()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(None)
    # THEN every key our synthetic fixture uses occurs in the real snapshot
    _assert_fake_format_within(snap)
    # AND when asked, the recording is kept as a fixture for CPU tests of every reader
    if os.environ.get("MEMPROFILER_RECORD_FIXTURE") == "1":
        out = Path(__file__).parents[1] / "fixtures" / "cuda_snapshot_tiny.pickle"
        out.write_bytes(pickle.dumps(snap, protocol=4))


def test_benchmark_skips_cleanly_without_cuda(capsys, monkeypatch):
    # GIVEN the GPU benchmark on a machine without CUDA (whatever this machine has)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    import json

    bench = load_script("benchmarks/allocator_history.py", "bench_allocator_history")
    # WHEN it runs THEN it exits 0 with one JSON line saying why it skipped
    assert bench.main([]) == 0
    assert json.loads(capsys.readouterr().out) == {"skipped": "no CUDA"}


def test_the_fakes_snapshot_format_is_a_subset_of_a_real_gpu_capture():
    # GIVEN the fake backend's synthetic snapshot and a real capture from a data-center GPU
    # (tests/fixtures/README.md says where it came from)
    real_path = Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle"
    real = load_snapshot(real_path)
    # THEN every key and action the fake writes occurs in what the GPU wrote
    _assert_fake_format_within(real)


def _assert_fake_format_within(real: dict) -> None:
    """Every key (top level, trace entries, segments, blocks) and every trace action of the
    fake backend's synthetic snapshot occurs in the real snapshot ``real``."""
    synthetic = load_fixture()
    assert set(synthetic) <= set(real)

    def keys(snap: dict, level: str) -> set:
        if level == "entry":
            return {k for trace in snap["device_traces"] for e in trace for k in e}
        if level == "segment":
            return {k for seg in snap["segments"] for k in seg}
        return {k for seg in snap["segments"] for b in seg["blocks"] for k in b}

    assert keys(synthetic, "entry") - {"device_free"} <= keys(real, "entry")
    assert keys(synthetic, "segment") <= keys(real, "segment")
    assert keys(synthetic, "block") <= keys(real, "block")
    # actions the allocator writes only on events a short capture may lack are left out
    real_actions = {e["action"] for trace in real["device_traces"] for e in trace}
    fake_actions = {e["action"] for trace in synthetic["device_traces"] for e in trace}
    assert fake_actions - {"snapshot", "oom", "device_free", "segment_free"} <= real_actions
