"""``report`` and ``merge-traces`` refuse rank files of two different runs put together; every
per-rank file carries its run's id (older files without one still read)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from torch import nn

from memprofiler import MemProfiler, layout
from memprofiler.__main__ import main
from memprofiler.analysis.runs.ids import stats_run_id
from memprofiler.output.stats_file import StatsFile
from memprofiler.output.timeline import MemoryTimeline

CONFIG = {
    "schedule": {"wait": 0, "warmup": 0, "active": 1, "repeat": 2},
    "collect_funcs": {"default": ["step"]},
}


def _real_run(save_dir: Path) -> MemProfiler:
    model = nn.Linear(8, 4)
    with MemProfiler(CONFIG, save_dir=save_dir, rank=0) as prof:
        for _ in range(2):
            with prof.profile("step", module=model):
                model(torch.randn(2, 8)).sum()
    return prof


def _rank_files(d: Path, rank: int, run_id: str | None) -> None:
    """Rank ``rank``'s stats YAML and memory trace as the profiler writes them, under run ``run_id``."""
    d.mkdir(parents=True, exist_ok=True)
    snapshots = {f"{rank}.step.1.{p}": {"rss": 1000 + rank} for p in ("start", "end")}
    StatsFile(d / layout.MEMORY_STATS_YAML.format(rank=rank), run_id).flush(snapshots, list(snapshots))
    timeline = MemoryTimeline(rank, run_id)
    timeline.dump(d)


def test_a_real_run_writes_its_manifest_id_into_every_rank_file(tmp_path):
    # GIVEN a real run
    prof = _real_run(tmp_path / "run")
    run_id = yaml.safe_load((tmp_path / "run" / layout.RUN_MANIFEST).read_text())["run_id"]
    # THEN the stats YAML and the memory trace carry the manifest's run id
    assert stats_run_id(tmp_path / "run" / layout.MEMORY_STATS_YAML.format(rank=0)) == run_id
    trace = json.loads((tmp_path / "run" / layout.MEMORY_TRACE_JSON.format(rank=0)).read_text())
    assert trace["otherData"][layout.TRACE_RUN_ID_KEY] == run_id
    # AND the stats still load as before: the id line is a comment
    stats = yaml.safe_load((tmp_path / "run" / layout.MEMORY_STATS_YAML.format(rank=0)).read_text())
    assert list(stats) == [f"0.step.{c}.{p}" for c in (1, 2) for p in ("start", "end")]
    assert prof.save_dir == tmp_path / "run"


def test_report_refuses_two_runs_node_directories(tmp_path, capsys):
    # GIVEN node directories of two different runs: rank 0 of run aaa, rank 1 of run bbb
    _rank_files(tmp_path / "node0", 0, "aaa111")
    _rank_files(tmp_path / "node1", 1, "bbb222")
    # WHEN report reads them as one run's nodes
    code = main(["report", str(tmp_path / "node0"), str(tmp_path / "node1"), "--no-html"])
    # THEN one line names a file of each run and the fix, exit code 2
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{str(tmp_path / 'node0' / 'rank_0_memory_stats.yaml')!r} is from run aaa111 but " in err
    assert f"{str(tmp_path / 'node1' / 'rank_1_memory_stats.yaml')!r} from run bbb222" in err
    assert "pass the directories of one run" in err


def test_report_refuses_two_runs_files_in_one_directory(tmp_path, capsys):
    # GIVEN one directory holding rank 0 of one run and rank 1 copied in from another
    _rank_files(tmp_path / "run", 0, "aaa111")
    _rank_files(tmp_path / "run", 1, "bbb222")
    # WHEN report reads it THEN the same refusal
    assert main(["report", str(tmp_path / "run"), "--no-html"]) == 2
    assert "is from run aaa111 but" in capsys.readouterr().err


def test_merge_traces_refuses_two_runs(tmp_path, capsys):
    _rank_files(tmp_path / "node0", 0, "aaa111")
    _rank_files(tmp_path / "node1", 1, "bbb222")
    assert (
        main(
            ["merge-traces", str(tmp_path / "node0"), str(tmp_path / "node1"), "-o", str(tmp_path / "m.json")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory_trace_rank_0.json' is from run aaa111 but" in err
    assert not (tmp_path / "m.json").exists()


def test_one_runs_files_and_older_files_without_an_id_still_merge(tmp_path, capsys):
    # GIVEN rank 0 and 1 of one run, and rank 2 written before files carried an id
    _rank_files(tmp_path / "node0", 0, "aaa111")
    _rank_files(tmp_path / "node1", 1, "aaa111")
    _rank_files(tmp_path / "node2", 2, None)
    dirs = [str(tmp_path / f"node{i}") for i in range(3)]
    # WHEN merged THEN both commands succeed with every rank
    assert main(["merge-traces", *dirs, "-o", str(tmp_path / "m.json")]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["otherData"]["memprofiler_ranks"] == [0, 1, 2]
    assert main(["report", *dirs, "--no-html"]) == 0


def _profiler_trace(path: Path, run_id: str | None, rank: int = 0, gz: bool = False) -> Path:
    """A small extended-profiler trace of run ``run_id``: its identity first, as the profiler
    writes it, then one step with one operator."""
    import gzip

    trace: dict[str, object] = {}
    if run_id is not None:
        trace["memprofiler"] = {"run_id": run_id, "rank": rank, "cycle": 1}
    trace["traceEvents"] = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 50,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(trace).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_report_traces_refuses_traces_of_two_runs(tmp_path, capsys):
    # GIVEN rank 0's trace of run aaa and rank 1's (gzip'd) of run bbb in one folder
    a = _profiler_trace(tmp_path / "t" / "fit_rank_0.1.pt.trace.json", "aaa111")
    b = _profiler_trace(tmp_path / "t" / "fit_rank_1.1.pt.trace.json.gz", "bbb222", rank=1, gz=True)
    # WHEN reported as traces THEN one line names a file of each run, exit 2
    assert main(["report", str(tmp_path / "t"), "--no-html"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{str(a)!r} is from run aaa111 but {str(b)!r} from run bbb222" in err
    # AND traces of a run directory's other run given with --traces are refused the same way
    _rank_files(tmp_path / "run", 0, "ccc333")
    assert main(["report", str(tmp_path / "run"), "--traces", str(a), "--no-html"]) == 2
    assert "from run ccc333" in capsys.readouterr().err


def test_diff_profiler_refuses_a_side_holding_two_runs(tmp_path, capsys):
    _profiler_trace(tmp_path / "before" / "fit_rank_0.1.pt.trace.json", "aaa111")
    _profiler_trace(tmp_path / "before" / "old" / "fit_rank_0.1.pt.trace.json", "ddd444")
    _profiler_trace(tmp_path / "after" / "fit_rank_0.1.pt.trace.json", "bbb222")
    assert main(["diff", str(tmp_path / "before"), str(tmp_path / "after"), "--profiler"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "from run aaa111" in err and "from run ddd444" in err
    # one run a side (and traces without an id) compare as before
    (tmp_path / "before" / "old" / "fit_rank_0.1.pt.trace.json").unlink()
    _profiler_trace(tmp_path / "before" / "fit_rank_1.1.pt.trace.json", None, rank=1)
    assert main(["diff", str(tmp_path / "before"), str(tmp_path / "after"), "--profiler"]) == 0


def test_a_folder_of_traces_alone_is_reported_as_traces(tmp_path, capsys):
    _profiler_trace(tmp_path / "t" / "fit_rank_0.1.pt.trace.json", "aaa111")
    assert main(["report", str(tmp_path / "t"), "--no-html"]) == 0
    out = capsys.readouterr().out
    assert "no memprofiler run files, only profiler traces: showing their views" in out
    assert "--traces" in out and "aten::mm" in out


def test_a_folder_of_traces_alone_is_told_by_the_errors_kind_not_its_wording(tmp_path, capsys, monkeypatch):
    from memprofiler.analysis.runs import artifacts
    from memprofiler.errors import ArtifactError

    # GIVEN the message for a folder without memprofiler files reworded
    find_runs = artifacts.find_runs

    def reworded(root: object) -> object:
        try:
            return find_runs(root)  # type: ignore[arg-type]
        except ArtifactError as err:
            err.args = (str(err).replace("no memprofiler files found", "holds none of memprofiler's files"),)
            raise

    monkeypatch.setattr(artifacts, "find_runs", reworded)
    _profiler_trace(tmp_path / "t" / "fit_rank_0.1.pt.trace.json", "aaa111")
    # WHEN a folder of traces alone is reported
    rc = main(["report", str(tmp_path / "t"), "--no-html"])
    # THEN it is still shown as traces
    out = capsys.readouterr().out
    assert rc == 0 and "no memprofiler run files, only profiler traces: showing their views" in out
    # AND a folder without memprofiler files or traces is refused in the new words
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--no-html"]) == 2
    assert "holds none of memprofiler's files" in capsys.readouterr().err


def test_traces_beside_a_broken_memprofiler_file_are_no_traces_only_folder(tmp_path, capsys):
    # GIVEN a folder of traces that also holds an empty stats file (a run's, cut)
    _profiler_trace(tmp_path / "t" / "fit_rank_0.1.pt.trace.json", "aaa111")
    (tmp_path / "t" / "rank_0_memory_stats.yaml").write_text("")
    # WHEN reported, THEN the broken file is the one-line error, not a traces-only report
    assert main(["report", str(tmp_path / "t"), "--no-html"]) == 2
    captured = capsys.readouterr()
    assert "rank_0_memory_stats.yaml" in captured.err and "only profiler traces" not in captured.out
