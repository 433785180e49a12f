"""A 2-rank gloo Lightning run writing to ``s3://`` (a real S3-compatible server on 127.0.0.1),
read back by the ``memprofiler`` command from the bucket and from node-local copies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from _env import run_cli
from _ranks import launch
from memprofiler import layout

pytestmark = pytest.mark.slow

WORLD = 2
SRC = Path(__file__).resolve().parents[2] / "src"
F32 = 4
#: Saved for backward by Linear(10, 33) -> ReLU -> Linear(33, 7) -> pow on a 4-row batch: the
#: input (4x10), the ReLU output (4x33, saved by ReLU and the second Linear: one tensor), the
#: second Linear's output (4x7, saved by pow).
SAVED_BYTES = F32 * (4 * 10 + 4 * 33 + 4 * 7)


def _launch(url: str) -> list[subprocess.CompletedProcess[str]]:
    return launch(lambda rank: [__file__, url], WORLD)


def _fs() -> Any:
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


@pytest.fixture(scope="module")
def remote_run(s3_server) -> str:
    """The run: ``s3://<bucket>/run``, written by two gloo ranks through Lightning DDP."""
    url = f"{s3_server.new_bucket()}/run"
    results = _launch(url)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
        assert "worker finished" in r.stdout, r.stdout[-4000:]
    return url


def test_ddp_run_on_two_ranks_writes_every_rank_to_the_bucket(remote_run):
    # GIVEN a 2-rank DDP run whose save_dir is s3://bucket/run
    fs, root = _fs(), remote_run.removeprefix("s3://")
    # THEN each rank's stats hold its collected calls with the analytic saved bytes
    for rank in range(WORLD):
        stats = yaml.safe_load(fs.cat_file(f"{root}/{layout.MEMORY_STATS_YAML.format(rank=rank)}"))
        assert list(stats) == [f"{rank}.training_step.{c}.{p}" for c in (2, 3) for p in ("start", "end")]
        assert stats[f"{rank}.training_step.3.end"]["saved_tensors.unique_bytes"] == SAVED_BYTES
        assert fs.exists(f"{root}/{layout.MEMORY_TRACE_JSON.format(rank=rank)}")
    # AND rank 0's manifest is closed and its cross-rank summary names both ranks
    manifest = yaml.safe_load(fs.cat_file(f"{root}/{layout.RUN_MANIFEST}"))
    assert (manifest["status"], manifest["world_size"], manifest["save_dir"]) == ("finished", 2, remote_run)
    summary = yaml.safe_load(fs.cat_file(f"{root}/{layout.MEMORY_SUMMARY_YAML}"))
    assert summary["ranks"] == [0, 1]
    # AND no write probe or temp file is left in the bucket
    assert all(not n.rsplit("/", 1)[1].startswith(".") for n in fs.find(root))


def test_report_reads_the_run_from_the_bucket(remote_run, tmp_path):
    # WHEN `memprofiler report s3://bucket/run` runs in a fresh process
    result = run_cli("report", remote_run, "-o", str(tmp_path / "r.html"), "--top", "3")
    # THEN it lists both ranks' calls and writes the HTML report locally
    assert result.returncode == 0, result.stderr
    rows = [ln for ln in result.stdout.splitlines() if "│ training_step │" in ln]
    assert [ln.split("│")[1].strip() for ln in rows] == ["0", "0", "1", "1"]
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_report_merges_node_local_directories_and_refuses_a_rank_twice(remote_run, tmp_path):
    # GIVEN the run split as two nodes' local disks would hold it: node 0 has rank 0, the manifest
    # and the summary; node 1 has rank 1
    fs, root = _fs(), remote_run.removeprefix("s3://")
    nodes = [tmp_path / "node0" / "run", tmp_path / "node1" / "run"]
    for path in fs.find(root):
        name = path.rsplit("/", 1)[1]
        node = nodes[1] if "rank_1" in name else nodes[0]
        node.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(node / name))
    # WHEN both are reported together
    result = run_cli("report", str(nodes[0]), str(nodes[1]), "--no-html")
    # THEN both ranks appear, and the cross-rank table too
    assert result.returncode == 0, result.stderr
    rows = [ln for ln in result.stdout.splitlines() if "│ training_step │" in ln]
    assert [ln.split("│")[1].strip() for ln in rows] == ["0", "0", "1", "1"]
    assert "Across ranks" in result.stdout
    # AND merge-traces takes the same directories
    merged = run_cli("merge-traces", str(nodes[0]), str(nodes[1]), "-o", str(tmp_path / "m.json"))
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.startswith("merged 2 rank(s)")
    # WHEN one node's directory is given twice
    twice = run_cli("report", str(nodes[1]), str(nodes[1]), "--no-html")
    # THEN one line refuses it, naming the rank and both directories
    assert twice.returncode == 2
    assert twice.stderr == (
        f"memprofiler report: error: rank 1 is in both {str(nodes[1])!r} and {str(nodes[1])!r}; "
        "pass each node's directory of one run once\n"
    )
    twice = run_cli("merge-traces", str(nodes[1]), remote_run, "-o", str(tmp_path / "m2.json"))
    assert twice.returncode == 2
    assert twice.stderr == (
        f"memprofiler merge-traces: error: rank 1 is in both {str(nodes[1])!r} and {remote_run!r}; "
        "pass each node's directory of one run once\n"
    )


def test_check_and_diff_read_the_bucket_as_they_read_a_local_copy(remote_run, tmp_path):
    # GIVEN the run in the bucket and a local copy of it
    local = tmp_path / "copy"
    _fs().get(remote_run.removeprefix("s3://") + "/", str(local), recursive=True)
    assert (local / layout.MEMORY_STATS_YAML.format(rank=1)).is_file()
    # WHEN the bucket is diffed against the copy, with unchanged values shown
    diff = run_cli(
        "diff", remote_run, str(local), "--all", "--per-call", "--metric", "saved_tensors.unique_bytes"
    )
    # THEN every value is the same on both sides: the analytic saved bytes of each rank's end
    # snapshots (the only ones with saved tensors)
    assert diff.returncode == 0, diff.stderr
    rows = [ln for ln in diff.stdout.splitlines() if "saved_tensors.unique_bytes" in ln]
    assert SAVED_BYTES == 800
    assert rows == [
        f"│ {r}.training_step.{c}.end │ saved_tensors.unique_bytes │ 800 B │ 800 B │    0 B │ +0.0% │"
        for r in (0, 1)
        for c in (2, 3)
    ]
    # AND `check` gates the bucket's values with the analytic saved bytes as the limit
    ok = run_cli("check", remote_run, "--max", f"saved_tensors.unique_bytes={SAVED_BYTES}B", "--key", "*.end")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    over = run_cli(
        "check", remote_run, "--max", f"saved_tensors.unique_bytes={SAVED_BYTES - 1}B", "--key", "*.end"
    )
    assert over.returncode == 1


def test_a_cut_file_in_the_bucket_is_named_by_its_url(remote_run, s3_server):
    # GIVEN a copy of the run in another bucket whose rank-1 stats file was cut mid-append
    fs, root = _fs(), remote_run.removeprefix("s3://")
    cut_url = f"{s3_server.new_bucket()}/run"
    for path in fs.find(root):
        name = path.rsplit("/", 1)[1]
        data = fs.cat_file(path)
        if name == layout.MEMORY_STATS_YAML.format(rank=1):
            data += b'1.training_step.4.start: {"rss": 1'
        fs.pipe_file(f"{cut_url.removeprefix('s3://')}/{name}", data)
    # WHEN reported and diffed (read a block at a time, after the download)
    for args in (["report", cut_url, "--no-html"], ["diff", remote_run, cut_url]):
        result = run_cli(*args)
        # THEN the warning names the file by its URL, not the temporary local copy
        assert result.returncode == 0, result.stderr
        [warning] = [ln for ln in result.stderr.splitlines() if "cut short" in ln]
        assert f"{cut_url}/{layout.MEMORY_STATS_YAML.format(rank=1)}: cut short" in warning
        assert "memprofiler-read-" not in result.stderr


def test_snapshot_reads_a_pickle_from_the_bucket(s3_bucket):
    # GIVEN an allocator snapshot uploaded to a bucket
    import pickle

    from snapshot_fixtures import known_snapshot

    url = f"{s3_bucket}/cuda_alloc_rank_0.training_step.2.end.pickle"
    _fs().pipe_file(url.removeprefix("s3://"), pickle.dumps(known_snapshot(), protocol=4))
    # WHEN `memprofiler snapshot` is given its URL
    result = run_cli("snapshot", url)
    # THEN it analyses it as it would the local file
    assert result.returncode == 0, result.stderr
    assert "peak active 2.25 MiB requested (entry 5, t=0.000140s)" in result.stdout


def test_a_missing_run_url_is_one_line(s3_server):
    # WHEN a URL that holds nothing is reported
    url = f"{s3_server.new_bucket()}/nothing"
    result = run_cli("report", url, "--no-html")
    # THEN one line names it
    assert result.returncode == 2
    assert (
        result.stderr
        == f"memprofiler report: error: {url}: no such directory or file; pass the run's save_dir URL\n"
    )


def _worker(url: str) -> None:  # pragma: no cover - runs in the subprocesses
    import lightning.pytorch as pl
    import torch
    from torch import nn

    from memprofiler import MemProfilerCallback, memprofilable

    torch.manual_seed(0)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Sequential(nn.Linear(10, 33), nn.ReLU(), nn.Linear(33, 7))

        @memprofilable
        def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
            return self.model(batch).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.randn(64, 10), batch_size=4)

    cb = MemProfilerCallback({"save_dir": url, "schedule": {"warmup": 1, "active": 2}})
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp",
        max_epochs=1,
        limit_train_batches=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
    )
    trainer.fit(Net())
    mirror = cb.profiler._files.mirror if cb.profiler is not None else None
    if mirror is not None:
        mirror.cleanup()  # os._exit below skips the atexit hook that removes the staging directory
    print("worker finished", os.environ["RANK"], flush=True)


if __name__ == "__main__":
    _worker(sys.argv[1])
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as in test_multirank: skip c10d/gloo static destructors
