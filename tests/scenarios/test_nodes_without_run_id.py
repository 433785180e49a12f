"""Two real 2-rank gloo runs whose rank 1 never learned the run id (it could not reach the process
group's store), each split as two nodes' local disks would hold it. Rank 1's files carry no id,
so only what else they carry tells run A's rank 1 from run B's: the cross-rank summary on rank 0's
node counted rank 1's figures. ``report`` and ``merge-traces`` merge a run's own nodes without a
word and refuse rank 1 of the other run in one line."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from _env import run_cli
from _ranks import launch
from memprofiler import layout
from memprofiler.analysis.runs.ids import stats_run_id

pytestmark = pytest.mark.slow

WORLD = 2
SRC = Path(__file__).resolve().parents[2] / "src"
F32 = 4
BATCH, IN = 4, 8
#: Saved for backward by Linear(IN, width) -> ReLU on a BATCH-row batch: the Linear's input and
#: the ReLU's output (the weight is a parameter, not counted).
WIDTHS = {"a": 16, "b": 32}


def _saved(width: int) -> int:
    return F32 * (BATCH * IN + BATCH * width)


def _worker(run_dir: str, width: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from memprofiler import MemProfiler
    from memprofiler.core import run_setup

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:  # a rank that cannot reach the store never learns the run id (nor asks the directory)
        run_setup._store = lambda: None
    model = nn.Sequential(nn.Linear(IN, width), nn.ReLU())
    config = {"schedule": {"wait": 0, "warmup": 0, "active": 2}, "collect_funcs": {"default": ["step"]}}
    with MemProfiler(config, save_dir=run_dir, rank=rank) as prof:
        for _ in range(2):
            with prof.profile("step", module=model):
                model(torch.randn(BATCH, IN)).sum().backward()
    print("worker finished", flush=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Run ``a`` and run ``b``, each as (rank 0's node, rank 1's node)."""
    root = tmp_path_factory.mktemp("nodes")
    out: dict[str, tuple[Path, Path]] = {}
    for name, width in WIDTHS.items():
        shared = root / name / "run"
        for r in launch(lambda rank, d=shared, w=width: [__file__, str(d), str(w)], WORLD):
            assert r.returncode == 0, r.stdout[-4000:]
            assert "worker finished" in r.stdout, r.stdout[-4000:]
        nodes = (root / name / "node0", root / name / "node1")
        for node in nodes:
            node.mkdir()
        for path in shared.iterdir():  # node-local disks: rank 1's files on node 1, the rest on node 0
            shutil.copy2(path, nodes[1 if "rank_1" in path.name else 0] / path.name)
        out[name] = nodes
    return out


def test_rank_one_wrote_no_run_id_but_its_world_size(runs):
    node0, node1 = runs["a"]
    run_id = yaml.safe_load((node0 / layout.RUN_MANIFEST).read_text())["run_id"]
    assert stats_run_id(node0 / layout.MEMORY_STATS_YAML.format(rank=0)) == run_id
    assert stats_run_id(node1 / layout.MEMORY_STATS_YAML.format(rank=1)) is None
    other = json.loads((node1 / layout.MEMORY_TRACE_JSON.format(rank=1)).read_text())["otherData"]
    assert layout.TRACE_RUN_ID_KEY not in other and other[layout.TRACE_WORLD_SIZE_KEY] == WORLD
    summary = yaml.safe_load((node0 / layout.MEMORY_SUMMARY_YAML).read_text())
    assert summary["ranks"] == [0, 1]


def test_a_runs_own_nodes_merge_without_a_word(runs, tmp_path):
    node0, node1 = runs["a"]
    result = run_cli("report", str(node0), str(node1), "--no-html")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "ranks: 0, 1" in result.stdout
    merged = run_cli("merge-traces", str(node0), str(node1), "-o", str(tmp_path / "m.json"))
    assert merged.returncode == 0 and merged.stderr == "", merged.stderr
    # the figures are the runs' own: both ranks saved the Linear's input and the ReLU's output
    summary = yaml.safe_load((node0 / layout.MEMORY_SUMMARY_YAML).read_text())
    saved = summary["snapshots"]["step.1.end"]["saved_tensors.unique_bytes"]
    assert (saved["min"], saved["max"], saved["n_ranks"]) == (_saved(16), _saved(16), WORLD)


def test_the_other_runs_rank_one_is_refused_by_the_summary(runs, tmp_path):
    node0, _ = runs["a"]
    _, other = runs["b"]
    stats = other / layout.MEMORY_STATS_YAML.format(rank=1)
    summary = node0 / layout.MEMORY_SUMMARY_YAML
    for argv in (
        ["report", str(node0), str(other), "--no-html"],
        ["merge-traces", str(node0), str(other), "-o", str(tmp_path / "m.json")],
    ):
        result = run_cli(*argv)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert (
            f"error: {str(stats)!r} does not match the cross-rank summary {str(summary)!r}: its `" in lines[0]
        )
        assert lines[0].endswith(
            "two runs' files would be merged as one; pass the directories of one run "
            "(or move the other run's files out)"
        )
    assert not (tmp_path / "m.json").exists()
    # the figure that gives it away, when rss happens to fall inside run a's range
    end = yaml.safe_load(stats.read_text())["1.step.1.end"]
    assert end["saved_tensors.unique_bytes"] == _saved(32) != _saved(16)


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as in test_multirank: skip c10d/gloo static destructors
