"""Directories that are almost URLs are refused before anything is written; an in-process store warns."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from conftest import TinyMLP, make_trainer
from memprofiler import MemProfiler, MemProfilerCallback, MemProfilerConfig, layout
from memprofiler.config.urls import check_dir
from memprofiler.errors import ConfigError

CONFIG = {"schedule": {"wait": 0, "warmup": 0, "active": 1}, "collect_funcs": {"default": ["step"]}}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "s3:/b-x/run",
            "`k`: 's3:/b-x/run' is not a valid s3 URL (it would be a local folder named 's3:'); write 's3://b-x/run'",
        ),
        (
            "gs:bucket/run",
            "`k`: 'gs:bucket/run' is not a valid gs URL (it would be a local folder named 'gs:'); write 'gs://bucket/run'",
        ),
        (
            "file:/tmp/x",
            "`k`: 'file:/tmp/x' is not a valid file URL (it would be a local folder named 'file:'); write '/tmp/x'",
        ),
        ("s3:", "`k`: 's3:' names no location; write 's3://BUCKET/PATH'"),
        ("s3://", "`k`: 's3://' names no bucket (nothing between 's3://' and '/'); write 's3://BUCKET/PATH'"),
        (
            "s3:///x",
            "`k`: 's3:///x' names no bucket (nothing between 's3://' and '/'); write 's3://BUCKET/x'",
        ),
        ("s3://ab/run", "`k`: bucket 'ab' in 's3://ab/run' cannot exist (S3 bucket names are 3-63 lowercase"),
        ("s3://Runs/x", "`k`: bucket 'Runs' in 's3://Runs/x' cannot exist"),
        ("s3://a..b/x", "`k`: bucket 'a..b' in 's3://a..b/x' cannot exist"),
        ("s3://10.0.0.1/x", "`k`: bucket '10.0.0.1' in 's3://10.0.0.1/x' cannot exist"),
        ("gs://-bad/x", "`k`: bucket '-bad' in 'gs://-bad/x' cannot exist (GCS bucket names"),
    ],
)
def test_an_almost_right_url_is_one_line_naming_the_key_and_the_fix(value, message):
    with pytest.raises(ConfigError) as info:
        check_dir(value, "k")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "runs/a",
        "/abs/x",
        "exp:1/run",
        "C:/x",
        "s3://my-bucket.v2/run",
        "gs://my_bucket/x",
        "memory://x",
        "abfs://container@account.dfs.core.windows.net/x",
        "file:///tmp/x",
        "hdfs://nn:8020/x",
    ],
)
def test_local_paths_and_well_formed_urls_pass(value):
    check_dir(value, "k")


def test_the_config_refuses_it_naming_save_dir():
    with pytest.raises(ConfigError, match=r"^`save_dir`: 's3:/bucket/run' is not a valid s3 URL"):
        MemProfilerConfig.from_any({"save_dir": "s3:/bucket/run"})


def test_the_api_refuses_it_before_writing_anything(tmp_path, monkeypatch):
    # GIVEN save_dir given to the profiler itself with one slash
    monkeypatch.chdir(tmp_path)
    # WHEN the profiler is built THEN it refuses, and no folder named `s3:` appears
    with pytest.raises(ConfigError, match=r"^`save_dir`: 's3:/bucket/run' is not a valid s3 URL"):
        MemProfiler(CONFIG, save_dir="s3:/bucket/run", rank=0)
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_default_root_dir_names_that_key(tmp_path, monkeypatch):
    # GIVEN a Trainer whose default_root_dir is almost an S3 URL, and no save_dir
    monkeypatch.chdir(tmp_path)
    cb = MemProfilerCallback({"schedule": {"active": 1}})
    # WHEN it fits THEN set-up refuses, naming trainer.default_root_dir; nothing is profiled
    with pytest.raises(
        ConfigError, match=r"^`trainer.default_root_dir`: 's3:/bucket/logs' is not a valid s3 URL"
    ):
        make_trainer("s3:/bucket/logs", [cb]).fit(TinyMLP())  # type: ignore[arg-type]
    assert not (tmp_path / "s3:" / "bucket" / "logs" / layout.DEFAULT_SUBDIR).exists()


def test_a_memory_store_warns_that_it_dies_with_the_process_and_still_holds_the_run():
    # GIVEN save_dir in fsspec's in-process memory store, through the API
    import fsspec

    model = nn.Linear(4, 2)
    # WHEN a run is profiled THEN a warning says the files go when the process exits
    warned = pytest.warns(UserWarning, match=r"'memory://mp-test/run' is fsspec's in-process memory store: ")
    with (
        warned,
        MemProfiler(CONFIG, save_dir="memory://mp-test/run", rank=0) as prof,
        prof.profile("step", module=model),
    ):
        model(torch.randn(3, 4)).sum()
    # AND the files are there until then, for this process to read
    fs = fsspec.filesystem("memory")
    stats = yaml.safe_load(fs.cat_file(f"/mp-test/run/{layout.MEMORY_STATS_YAML.format(rank=0)}"))
    assert list(stats) == ["0.step.1.start", "0.step.1.end"]


def test_each_directory_is_checked_once_where_it_enters(tmp_path, monkeypatch):
    # GIVEN a spy on the one check, wherever it is called from
    from memprofiler.config import root, urls

    seen: list[tuple[str, str]] = []
    real = urls.check_dir

    def spy(value, key):
        seen.append((str(value), key))
        real(value, key)

    monkeypatch.setattr(urls, "check_dir", spy)
    monkeypatch.setattr(root, "check_dir", spy)
    # WHEN a profiler is built from a config naming save_dir, and one given save_dir itself
    MemProfiler({"save_dir": str(tmp_path / "a")}, rank=0)
    MemProfiler(CONFIG, save_dir=str(tmp_path / "b"), rank=0)
    # THEN each directory was checked once, under the key the user wrote
    assert seen == [(str(tmp_path / "a"), "save_dir"), (str(tmp_path / "b"), "save_dir")]
