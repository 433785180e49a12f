"""Node directories whose rank files carry no run id (a rank that never learned it): ``report`` and
``merge-traces`` judge them by what else the files carry: refused in one line where it proves two
runs, a warning line where it only suggests it, and never merged without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from memprofiler import MemProfiler, layout
from memprofiler.__main__ import main
from memprofiler.analysis.runs.evidence import FIX, PEEK_BYTES, SKEW_S, trace_evidence
from memprofiler.core.summary import write_summary
from memprofiler.output.run_dir import RunManifest, write_manifest
from memprofiler.output.stats_file import StatsFile
from memprofiler.output.timeline import MemoryTimeline

CONFIG = {
    "schedule": {"wait": 0, "warmup": 0, "active": 1, "repeat": 2},
    "collect_funcs": {"default": ["step"]},
}
#: Linear(8, width) saves its 2x8 float32 input for backward: 64 bytes, whatever the width.
SAVED = 2 * 8 * 4
TWO_DAYS_NS = 2 * 86_400 * 10**9


def _real_rank(save_dir: Path, rank: int) -> None:
    """A real CPU run of ``rank`` without a process group: rank 0 writes the manifest and its id;
    another rank never learns the id, so its files carry none (as a rank cut off from rank 0)."""
    model = nn.Linear(8, 4)
    with MemProfiler(CONFIG, save_dir=save_dir, rank=rank) as prof:
        for _ in range(2):
            with prof.profile("step", module=model):
                model(torch.randn(2, 8)).sum()


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[Path, Path]:
    """Two nodes' directories of real runs: rank 0's (manifest, id) and rank 1's (no id)."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    _real_rank(node0, 0)
    _real_rank(node1, 1)
    return node0, node1


def _shift_trace(trace: Path, ns: int) -> None:
    data = json.loads(trace.read_text())
    data["baseTimeNanoseconds"] += ns
    trace.write_text(json.dumps(data))


def _edit_manifest(node: Path, **fields: object) -> Path:
    path = node / layout.RUN_MANIFEST
    doc = yaml.safe_load(path.read_text())
    doc.update(fields)
    write_manifest(node, RunManifest(**doc))
    return path


def _stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_a_real_rank_without_an_id_writes_its_times_and_no_world_size_without_a_group(nodes):
    # GIVEN rank 1's real files, written without a process group
    trace = nodes[1] / layout.MEMORY_TRACE_JSON.format(rank=1)
    data = json.loads(trace.read_text())
    # THEN they carry no run id and no world size (no group: it is not known)
    assert layout.TRACE_RUN_ID_KEY not in data["otherData"]
    assert layout.TRACE_WORLD_SIZE_KEY not in data["otherData"]
    # AND the evidence read from the file's two ends is its first and last record, exactly
    spans = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    base = data["baseTimeNanoseconds"] / 1e9
    first_ts = min(e["ts"] for e in data["traceEvents"] if "ts" in e)
    evidence = trace_evidence(trace, 1)
    assert evidence.rank == 1 and evidence.run_id is None and evidence.world_size is None
    assert evidence.start == pytest.approx(base + first_ts / 1e6, abs=1e-6)
    assert evidence.end == pytest.approx(base + max(e["ts"] + e["dur"] for e in spans) / 1e6, abs=1e-6)


def test_rank_files_without_an_id_merge_with_one_warning_when_nothing_disproves_them(nodes, capsys):
    # GIVEN rank 0's node (manifest: world size 1, no process group) and rank 1's, same minutes
    # WHEN report merges them
    code = main(["report", *map(str, nodes), "--no-html"])
    # THEN both ranks are read, with their real figures, and one warning line says the doubt
    assert code == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"memprofiler report: warning: {str(nodes[1] / 'rank_1_memory_stats.yaml')!r} is rank 1's but "
        f"{str(nodes[0] / layout.RUN_MANIFEST)!r} says world size 1 (as a run without a process group "
        f"writes): perhaps two runs; merged anyway; if so, {FIX}"
    ]
    assert "ranks: 0, 1" in out
    from memprofiler.commands._shared import load_many

    run = load_many("report", [str(n) for n in nodes])
    capsys.readouterr()
    assert run.ranks == [0, 1]
    assert {k: m["saved_tensors.unique_bytes"] for k, m in run.snapshots().items() if k.endswith(".end")} == {
        f"{r}.step.{c}.end": SAVED for r in (0, 1) for c in (1, 2)
    }


def test_a_rank_two_days_older_than_the_run_is_refused_by_both_commands(nodes, tmp_path, capsys):
    # GIVEN rank 1's trace from two days before rank 0's run (a leftover of another job)
    trace = nodes[1] / layout.MEMORY_TRACE_JSON.format(rank=1)
    _shift_trace(trace, -TWO_DAYS_NS)
    manifest = nodes[0] / layout.RUN_MANIFEST
    for argv in (
        ["report", *map(str, nodes), "--no-html"],
        ["merge-traces", *map(str, nodes), "-o", str(tmp_path / "m.json")],
    ):
        # WHEN merged THEN one line names both files, why and the fix; exit 2; nothing written
        assert main(argv) == 2
        err = _stderr_lines(capsys)
        assert len(err) == 1, err
        assert (
            f"error: {str(trace)!r} ends 2.0 days before the run of {str(manifest)!r} started, more than "
            "the run lasted (0 s)" in err[0]
        )
        assert err[0].endswith(f"two runs' files would be merged as one; {FIX}")
    assert not (tmp_path / "m.json").exists()


def test_a_rank_some_minutes_after_a_long_run_ended_only_warns(nodes, capsys):
    # GIVEN a run that lasted an hour, and rank 1's trace 15 minutes after it ended
    trace = nodes[1] / layout.MEMORY_TRACE_JSON.format(rank=1)
    started = trace_evidence(trace, 1).start
    assert started is not None
    import datetime as dt

    def iso(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")

    manifest = _edit_manifest(nodes[0], started=iso(started - 3600 - 900), finished=iso(started - 900))
    # WHEN report merges them THEN it goes on, with a line for the gap (and the world size)
    assert main(["report", *map(str, nodes), "--no-html"]) == 0
    err = _stderr_lines(capsys)
    assert (
        f"memprofiler report: warning: {str(trace)!r} starts 15 min after the run of {str(manifest)!r} "
        f"ended: perhaps two runs; merged anyway; if so, {FIX}"
    ) in err
    assert len(err) == 2


def _hand_rank(d: Path, rank: int, run_id: str | None, rss: int, world_size: int | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    snapshots = {f"{rank}.step.1.{p}": {"rss": rss} for p in ("start", "end")}
    path = d / layout.MEMORY_STATS_YAML.format(rank=rank)
    StatsFile(path, run_id).flush(snapshots, list(snapshots))
    MemoryTimeline(rank, run_id, world_size).dump(d)
    return path


def _rank0_node(d: Path, world_size: int, rss_of: dict[int, int] | None = None) -> None:
    """Rank 0's node of run aaa111: its stats, the manifest and (given ``rss_of``) the summary."""
    _hand_rank(d, 0, "aaa111", 1000)
    manifest = RunManifest.new(d, world_size)
    manifest.run_id = "aaa111"
    manifest.finish("finished", [])
    write_manifest(d, manifest)
    if rss_of is not None:
        per_rank = {r: {f"{r}.step.1.{p}": {"rss": v} for p in ("start", "end")} for r, v in rss_of.items()}
        write_summary(d, per_rank, world_size)


def test_a_rank_beyond_the_runs_world_size_is_refused(tmp_path, capsys):
    # GIVEN a 2-rank run's rank 0 node, and a rank 3 (another, larger job's) without an id
    _rank0_node(tmp_path / "node0", 2)
    stats = _hand_rank(tmp_path / "node1", 3, None, 1000)
    # WHEN report merges them THEN refused: rank 3 cannot belong to a 2-rank run
    assert main(["report", str(tmp_path / "node0"), str(tmp_path / "node1"), "--no-html"]) == 2
    err = _stderr_lines(capsys)
    manifest = tmp_path / "node0" / layout.RUN_MANIFEST
    assert err == [
        f"memprofiler report: error: {str(stats)!r} is rank 3's but "
        f"{str(manifest)!r} says the run had 2 ranks (0..1): two runs' files would be merged as one; {FIX}"
    ]
    assert stats.exists()


def test_two_world_sizes_are_refused(tmp_path, capsys):
    # GIVEN a 2-rank run's rank 0 node, and rank 1 of a 4-rank job (its trace says so)
    _rank0_node(tmp_path / "node0", 2)
    _hand_rank(tmp_path / "node1", 1, None, 1000, world_size=4)
    # WHEN merged THEN refused, naming the manifest and the trace
    assert (
        main(
            ["merge-traces", str(tmp_path / "node0"), str(tmp_path / "node1"), "-o", str(tmp_path / "m.json")]
        )
        == 2
    )
    err = _stderr_lines(capsys)
    assert err == [
        f"memprofiler merge-traces: error: {str(tmp_path / 'node0' / layout.RUN_MANIFEST)!r} says world size 2 "
        f"but {str(tmp_path / 'node1' / 'memory_trace_rank_1.json')!r} world size 4: two runs' files would be "
        f"merged as one; {FIX}"
    ]


def test_figures_outside_the_cross_rank_summary_are_refused_and_matching_ones_merge_silently(
    tmp_path, capsys
):
    # GIVEN a 2-rank run whose summary saw rank 1 at rss 3000, and a rank 1 file without an id at 5000
    _rank0_node(tmp_path / "node0", 2, rss_of={0: 1000, 1: 3000})
    stats = _hand_rank(tmp_path / "node1", 1, None, 5000, world_size=2)
    dirs = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    # WHEN report merges them THEN refused: that file is not the one the summary counted
    assert main(["report", *dirs, "--no-html"]) == 2
    summary = tmp_path / "node0" / layout.MEMORY_SUMMARY_YAML
    assert _stderr_lines(capsys) == [
        f"memprofiler report: error: {str(stats)!r} does not match the cross-rank summary {str(summary)!r}: "
        f"its `rss` at step.1.start is 5,000, outside the run's range 1,000..3,000 over its ranks: two runs' "
        f"files would be merged as one; {FIX}"
    ]
    # AND the run's own rank 1 (rss 3000, same world size, same minutes) merges without a word
    _hand_rank(tmp_path / "node1", 1, None, 3000, world_size=2)
    assert main(["report", *dirs, "--no-html"]) == 0
    assert _stderr_lines(capsys) == []


def test_files_with_nothing_to_check_against_merge_with_one_warning(tmp_path, capsys):
    # GIVEN ranks 0 and 1 of run aaa111 without a manifest, and rank 2 written before ids existed
    for rank, run_id in ((0, "aaa111"), (1, "aaa111"), (2, None)):
        _hand_rank(tmp_path / f"node{rank}", rank, run_id, 1000)
    dirs = [str(tmp_path / f"node{i}") for i in range(3)]
    # WHEN report merges them THEN it goes on, and one line says rank 2 could not be checked
    assert main(["report", *dirs, "--no-html"]) == 0
    stats = tmp_path / "node2" / "rank_2_memory_stats.yaml"
    assert _stderr_lines(capsys) == [
        f"memprofiler report: warning: {str(stats)!r} carries no run id and nothing to check it against "
        "(no world size, cross-rank summary or run times beside it): merged as one run on trust; make sure "
        "the directories are of one run"
    ]


def test_traces_without_a_manifest_an_hour_apart_only_warn(nodes, tmp_path, capsys):
    # GIVEN rank 1's node and a copy of rank 0's without its manifest, rank 1 an hour later
    (nodes[0] / layout.RUN_MANIFEST).unlink()
    trace = nodes[1] / layout.MEMORY_TRACE_JSON.format(rank=1)
    _shift_trace(trace, 3600 * 10**9)
    # WHEN merge-traces merges them THEN it writes the merged trace and says why it doubts
    assert main(["merge-traces", *map(str, nodes), "-o", str(tmp_path / "m.json")]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1
    assert f"warning: {str(trace)!r} starts 60 min after " in captured.err
    assert "though one run's ranks run together: perhaps two runs; merged anyway" in captured.err
    assert json.loads((tmp_path / "m.json").read_text())["otherData"]["memprofiler_ranks"] == [0, 1]
    assert SKEW_S < 3600


def test_a_long_trace_is_read_from_its_two_ends_only(tmp_path):
    # GIVEN a real rank's trace of 400 calls, several times longer than what is read of each end
    model = nn.Linear(8, 4)
    config = {"schedule": {"wait": 0, "warmup": 0, "active": 400}, "collect_funcs": {"default": ["step"]}}
    with MemProfiler(config, save_dir=tmp_path, rank=1) as prof:
        for _ in range(400):
            with prof.profile("step", module=model):
                model(torch.randn(2, 8)).sum()
    trace = tmp_path / layout.MEMORY_TRACE_JSON.format(rank=1)
    assert trace.stat().st_size > 3 * PEEK_BYTES
    # THEN its first and last times are those of the whole file, to the microsecond
    data = json.loads(trace.read_text())
    base = data["baseTimeNanoseconds"] / 1e9
    events = [e for e in data["traceEvents"] if "ts" in e]
    evidence = trace_evidence(trace, 1)
    assert evidence.start == pytest.approx(base + min(e["ts"] for e in events) / 1e6, abs=1e-6)
    assert evidence.end == pytest.approx(
        base + max(e["ts"] + e.get("dur", 0) for e in events) / 1e6, abs=1e-6
    )


def test_when_every_rank_file_carries_an_id_no_trace_is_read(tmp_path, monkeypatch):
    # GIVEN two nodes of one run, every file with its id
    from memprofiler.analysis.runs import evidence as run_evidence

    _rank0_node(tmp_path / "node0", 2)
    _hand_rank(tmp_path / "node1", 1, "aaa111", 1000, world_size=2)

    def never(path: Path, rank: int) -> None:
        raise AssertionError(f"{path} was read")

    monkeypatch.setattr(run_evidence, "trace_evidence", never)
    # WHEN judged THEN the ids decide: nothing else is read, nothing is said
    dirs = [run_evidence.gather(tmp_path / f"node{i}") for i in range(2)]
    assert run_evidence.check_merge(dirs) == []


def test_several_ranks_against_a_world_size_of_one_get_one_line(nodes, capsys):
    # GIVEN a third node: real rank 2, also without a process group (so without the id)
    node2 = nodes[0].parent / "node2"
    _real_rank(node2, 2)
    # WHEN report merges the three THEN one warning line counts the other rank
    assert main(["report", *map(str, nodes), str(node2), "--no-html"]) == 0
    err = _stderr_lines(capsys)
    assert len(err) == 1
    assert err[0].startswith(
        f"memprofiler report: warning: {str(nodes[1] / 'rank_1_memory_stats.yaml')!r} (and 1 more rank(s)) is "
        "rank 1's but "
    )
