"""Remote save_dir faults of real clusters, on a real S3-compatible server (moto's)."""

from __future__ import annotations

import pytest

from conftest import TinyMLP, make_trainer
from memprofiler import MemProfiler, MemProfilerCallback
from memprofiler.errors import ArtifactError

CONFIG = {"schedule": {"wait": 0, "warmup": 0, "active": 1}, "collect_funcs": {"default": ["step"]}}


@pytest.fixture
def no_listing(monkeypatch):
    """Credentials that may write objects but not list the bucket: S3 answers AccessDenied to a
    listing, which s3fs raises as PermissionError."""
    import s3fs

    async def refuse(self, path, *args, **kwargs):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(s3fs.S3FileSystem, "_ls", refuse)
    # Cached instances hold sync wrappers made from the unpatched method.
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_write_but_not_list_is_one_line_naming_the_permission(s3_bucket, no_listing):
    # GIVEN a bucket the credentials may write to but not list
    url = f"{s3_bucket}/run"
    # WHEN the profiler claims its run directory there
    with pytest.raises(ArtifactError) as info:
        MemProfiler(CONFIG, save_dir=url, rank=0).setup()
    # THEN one line names the key, the URL and the permission to grant
    assert str(info.value) == (
        f"`save_dir` {url!r} can be written but not listed (PermissionError: Access Denied); memprofiler "
        "lists it to find a run directory no other run holds: allow `s3:ListBucket` on the bucket to "
        "these credentials, or choose a `save_dir` they may list"
    )


def test_write_but_not_list_fails_trainer_setup_with_that_line(tmp_path, s3_bucket, no_listing):
    # GIVEN a callback whose save_dir is in such a bucket
    cb = MemProfilerCallback({"schedule": {"active": 1}, "save_dir": f"{s3_bucket}/run"})
    model = TinyMLP()
    # WHEN the Trainer sets up THEN the same one line, before any step
    with pytest.raises(
        ArtifactError, match=r"^`save_dir` 's3://b-[0-9a-f]+/run' can be written but not listed"
    ):
        make_trainer(tmp_path, [cb]).fit(model)  # type: ignore[arg-type]
    assert model.steps_run == 0
