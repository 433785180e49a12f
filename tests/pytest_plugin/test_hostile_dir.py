"""``--memprofiler-dir`` under hostile input: a file, an almost-right URL, a bucket, a dead xdist worker."""

from __future__ import annotations

import pytest
import yaml

pytest_plugins = ["pytester", "_pytester"]

KIB = 1024

SUITE = """
@pytest.mark.memory_budget(saved_tensors="1MiB")
def test_a():
    step(batch=64)

@pytest.mark.memory_budget(saved_tensors="1MiB")
def test_b():
    step(batch=32)
"""


def test_a_file_as_the_dir_is_one_usage_line_naming_the_option(inner):
    # GIVEN --memprofiler-dir pointing at a file
    inner.write("test_suite", SUITE)
    (inner.path / "figures").write_text("not a directory")
    # WHEN pytest starts
    result = inner.run("--memprofiler-dir", "figures/run")
    # THEN no test runs, and one line names the option (not `save_dir`) and the fix
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert errors == [
        f"ERROR: `--memprofiler-dir` 'figures/run': {str(inner.path / 'figures')!r} is a file, not a "
        "directory; give `--memprofiler-dir` a directory (it is created if missing)"
    ]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_dir_that_breaks_during_the_session_prints_the_summary_naming_the_option(inner):
    # GIVEN a suite whose last test puts a file where the figures' directory goes
    inner.write(
        "test_suite",
        SUITE
        + """
def test_z_blocks():
    open("figures", "w").write("now a file")
""",
    )
    # WHEN it runs
    result = inner.run("--memprofiler-dir", "figures")
    # THEN the tests' outcomes stand and the summary says, in one line, that nothing was written
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "memprofiler: figures of 2 measured tests NOT written: `--memprofiler-dir` '*figures' is not writable *"
        ]
    )
    assert "Traceback" not in result.stdout.str() and "save_dir" not in result.stdout.str()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "s3:/bucket/figs",
            "`--memprofiler-dir`: 's3:/bucket/figs' is not a valid s3 URL (it would be a "
            "local folder named 's3:'); write 's3://bucket/figs'",
        ),
        ("s3:///figs", "`--memprofiler-dir`: 's3:///figs' names no bucket"),
        (
            "memory://figs",
            "`--memprofiler-dir`: 'memory://figs' is fsspec's in-process memory store: whatever "
            "is written there is gone when this pytest session ends",
        ),
    ],
)
def test_an_unusable_url_is_one_usage_line(inner, value, message):
    inner.write("test_suite", SUITE)
    result = inner.run("--memprofiler-dir", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {message}")
    assert not (inner.path / "s3:").exists()


def test_a_bucket_holds_the_figures(inner, s3_bucket):
    # GIVEN --memprofiler-dir in a bucket on a real S3-compatible server
    import s3fs

    inner.write("test_suite", SUITE)
    url = f"{s3_bucket}/figs"
    # WHEN the suite runs
    result = inner.run("--memprofiler-dir", url)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"memprofiler: figures of 2 measured tests in {url} *"])
    # THEN the figures are objects in the bucket, with the exact saved bytes, and no local folder
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    stats = yaml.safe_load(fs.cat_file(f"{url.removeprefix('s3://')}/rank_0_memory_stats.yaml"))
    assert {k: v["saved_tensors.unique_bytes"] for k, v in stats.items() if k.endswith(".end")} == {
        "0.test_suite.py::test_a.1.end": 192 * KIB,
        "0.test_suite.py::test_b.1.end": 96 * KIB,
    }
    manifest = yaml.safe_load(fs.cat_file(f"{url.removeprefix('s3://')}/memprofiler_run.yaml"))
    assert (manifest["status"], manifest["save_dir"]) == ("finished", url)
    assert not (inner.path / "s3:").exists()


@pytest.mark.slow
def test_a_killed_xdist_worker_keeps_what_it_measured_and_says_what_was_lost(inner):
    # GIVEN one xdist worker that measures two tests, then runs one that kills it
    inner.write(
        "test_suite",
        SUITE
        + """
@pytest.mark.memory_budget(saved_tensors="1MiB")
def test_c_kills():
    import os
    os._exit(9)

@pytest.mark.memory_budget(saved_tensors="1MiB")
def test_d_after():
    step(batch=16)
""",
    )
    # WHEN it runs (xdist replaces the dead worker)
    result = inner.run("-n", "1", "--memprofiler-dir", "figures", subprocess=True)
    # THEN the figures measured before the kill and after it are all in the run
    stats = yaml.safe_load((inner.path / "figures" / "rank_0_memory_stats.yaml").read_text())
    assert {k: v["saved_tensors.unique_bytes"] for k, v in stats.items() if k.endswith(".end")} == {
        "0.test_suite.py::test_a.1.end": 192 * KIB,
        "0.test_suite.py::test_b.1.end": 96 * KIB,
        "0.test_suite.py::test_d_after.1.end": 48 * KIB,
    }
    # AND the summary says which worker died, what was recovered and which test has no figures
    result.stdout.fnmatch_lines(
        [
            "memprofiler: xdist worker gw0 went down; the figures of the 2 tests it had measured were "
            "recovered from its spool; `test_suite.py::test_c_kills` was being measured and has no figures",
            "memprofiler: figures of 3 measured tests in *figures *",
        ]
    )
