"""A remote ``save_dir`` on a real S3-compatible server (moto's, on 127.0.0.1)."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml
from torch import nn

from memprofiler import MemProfiler, layout
from memprofiler.errors import ArtifactError
from memprofiler.output import remote
from memprofiler.output.remote import RemoteDir, is_url

F32 = 4
CONFIG = {
    "schedule": {"wait": 0, "warmup": 0, "active": 1, "repeat": 3},
    "collect_funcs": {"default": ["step"]},
}


def _fs():
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def _load_yaml(url: str) -> dict:
    return yaml.safe_load(_fs().cat_file(url.removeprefix("s3://")))


def _run(url: str, steps: int = 3) -> MemProfiler:
    model = nn.Linear(16, 8)
    with MemProfiler(CONFIG, save_dir=url, rank=0) as prof:
        for _ in range(steps):
            with prof.profile("step", module=model):
                model(torch.randn(4, 16)).pow(2).mean()
    return prof


def test_is_url_tells_remote_from_local():
    # GIVEN local paths, file URLs and object-store URLs
    # THEN only the object stores are remote
    assert [is_url(p) for p in ("runs/a", "/abs", "file:///tmp/x", "s3://b/r", "gs://b", "abfs://c/d")] == [
        False,
        False,
        False,
        True,
        True,
        True,
    ]


def test_a_file_url_is_a_local_save_dir(tmp_path):
    # GIVEN save_dir as a file:// URL WHEN the profiler is set up THEN it writes to that directory
    prof = MemProfiler(CONFIG, save_dir=f"file://{tmp_path}/run", rank=0).setup()
    assert (prof.save_url, prof.save_dir) == (None, tmp_path / "run")
    assert (tmp_path / "run" / layout.RUN_MANIFEST).is_file()


def test_plain_loop_writes_every_file_to_the_bucket(s3_bucket):
    # GIVEN a save_dir in a bucket
    url = f"{s3_bucket}/run"
    # WHEN a plain loop runs three collected steps
    prof = _run(url)
    # THEN the stats YAML, the trace and the finished manifest are objects in the bucket
    assert prof.run_url == url
    names = sorted(_fs().ls(url.removeprefix("s3://"), detail=False))
    assert [n.rsplit("/", 1)[1] for n in names] == [
        "memory_trace_rank_0.json",
        layout.RUN_MANIFEST,
        "rank_0_memory_stats.yaml",
    ]
    stats = _load_yaml(f"{url}/rank_0_memory_stats.yaml")
    assert list(stats) == [f"0.step.{c}.{p}" for c in (1, 2, 3) for p in ("start", "end")]
    # Linear's input (4x16) and pow's saved output (4x8)
    assert stats["0.step.3.end"]["saved_tensors.unique_bytes"] == F32 * (4 * 16 + 4 * 8)
    manifest = _load_yaml(f"{url}/{layout.RUN_MANIFEST}")
    assert (manifest["status"], manifest["save_dir"], manifest["world_size"]) == ("finished", url, 1)


def test_second_run_into_the_same_url_gets_version_1(s3_bucket):
    # GIVEN a finished run under s3://bucket/run
    url = f"{s3_bucket}/run"
    _run(url)
    # WHEN a second run is pointed at the same URL
    with pytest.warns(UserWarning, match="already holds a run; this run writes to"):
        second = _run(url, steps=1)
    # THEN it writes to version_1 and the first run's files are untouched
    assert second.run_url == f"{url}/version_1"
    assert len(_load_yaml(f"{url}/rank_0_memory_stats.yaml")) == 6
    assert len(_load_yaml(f"{url}/version_1/rank_0_memory_stats.yaml")) == 2


def test_claim_is_exclusive_on_s3(s3_bucket):
    # GIVEN a run directory whose manifest was just created by another job
    run = RemoteDir.from_url(f"{s3_bucket}/run")
    assert run.create(layout.RUN_MANIFEST, b"first") is True
    # WHEN a second job tries to create it too
    # THEN the conditional create refuses, and claim moves on to version_1
    assert run.create(layout.RUN_MANIFEST, b"second") is False
    claimed = remote.claim(run, b"second")
    assert claimed.url == f"{s3_bucket}/run/version_1"
    assert _fs().cat_file(f"{s3_bucket.removeprefix('s3://')}/run/{layout.RUN_MANIFEST}") == b"first"


def test_missing_bucket_is_one_line_before_training(s3_server):
    # GIVEN a save_dir in a bucket that does not exist
    prof = MemProfiler(CONFIG, save_dir="s3://no-such-bucket-here/run", rank=0)
    # WHEN the profiler is set up
    # THEN one line names the URL and the fix
    with pytest.raises(ArtifactError) as info:
        prof.setup()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "`save_dir` 's3://no-such-bucket-here/run' is not writable (FileNotFoundError: "
    )
    assert message.endswith("AWS_ENDPOINT_URL for S3-compatible stores) allow writing there")


def test_store_failing_mid_run_warns_and_keeps_what_was_written(s3_bucket, monkeypatch):
    # GIVEN a run whose first window reached the bucket
    url = f"{s3_bucket}/run"
    model = nn.Linear(16, 8)
    prof = MemProfiler(CONFIG, save_dir=url, rank=0).setup(model)
    with prof.profile("step", module=model):
        model(torch.randn(4, 16)).sum()
    prof.dump()
    assert prof._files.mirror is not None and prof._files.mirror.sync(wait=True)

    # WHEN the store starts refusing every write
    def refuse(self, name, data):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(RemoteDir, "put", refuse)
    with pytest.warns(
        UserWarning, match=r"could not write .* \(PermissionError: Access Denied\); training goes on"
    ):
        with prof.profile("step", module=model):
            model(torch.randn(4, 16)).sum()
        prof.teardown()
    # THEN the objects in the bucket are the valid first flush, and the complete files are local
    assert list(_load_yaml(f"{url}/rank_0_memory_stats.yaml")) == ["0.step.1.start", "0.step.1.end"]
    local = yaml.safe_load((prof.save_dir / "rank_0_memory_stats.yaml").read_text())
    assert len(local) == 4
    shutil.rmtree(prof.save_dir)  # kept by design (the store lacks its files); not a test's litter


def test_an_exception_leaves_the_crashed_run_in_the_bucket(s3_bucket):
    # GIVEN a plain loop writing to a bucket that fails in its third step
    url = f"{s3_bucket}/run"
    model = nn.Linear(16, 8)
    # WHEN the exception leaves the profiler's context
    with pytest.raises(RuntimeError, match="boom"), MemProfiler(CONFIG, save_dir=url, rank=0) as prof:
        for step in range(3):
            with prof.profile("step", module=model):
                if step == 2:
                    raise RuntimeError("boom")
                model(torch.randn(4, 16)).sum()
    # THEN the bucket holds every step, the failed one included, and a manifest that says the
    # run crashed
    assert list(_load_yaml(f"{url}/rank_0_memory_stats.yaml")) == [
        f"0.step.{c}.{p}" for c in (1, 2, 3) for p in ("start", "end")
    ]
    assert _load_yaml(f"{url}/{layout.RUN_MANIFEST}")["status"] == "crashed"
