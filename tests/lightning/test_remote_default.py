"""A Trainer whose log dir is in a bucket: memprofiler's files follow it there, as Lightning's do."""

from __future__ import annotations

import yaml

from conftest import TinyMLP, make_trainer
from memprofiler import MemProfilerCallback, layout


def test_save_dir_defaults_to_the_remote_default_root_dir(s3_bucket):
    # GIVEN a Trainer whose default_root_dir is s3://bucket/logs and no save_dir
    import s3fs

    root = f"{s3_bucket}/logs"
    cb = MemProfilerCallback({"schedule": {"warmup": 0, "active": 2}})
    # WHEN it fits
    make_trainer(root, [cb]).fit(TinyMLP())  # type: ignore[arg-type]
    # THEN the files are under s3://bucket/logs/memprofiler, with both collected calls
    assert cb.profiler is not None and cb.profiler.run_url == f"{root}/{layout.DEFAULT_SUBDIR}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    path = f"{root.removeprefix('s3://')}/{layout.DEFAULT_SUBDIR}/{layout.MEMORY_STATS_YAML.format(rank=0)}"
    assert [k.rsplit(".", 1)[1] for k in yaml.safe_load(fs.cat_file(path))] == ["start", "end"] * 2
