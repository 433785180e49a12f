"""Run discovery: names from layout.py, several runs in one directory, the manifest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memprofiler import layout
from memprofiler.analysis.runs import artifacts
from memprofiler.analysis.runs.artifacts import find_runs, load_run, parse_name
from v1_files import stats, write_run

SAMPLE = {
    "rank": "3",
    "fn": "model.encode",
    "call": "7",
    "phase": "end",
    "n": "2",
    "stage": "train",
    "cycle": "4",
}
#: layout constants that are not file names.
NOT_FILES = {
    "SNAPSHOT_KEY",
    "DEFAULT_SUBDIR",
    "RUN_VERSION_DIR",
    "YAML_HEADER",
    "YAML_BLOCK_END",
    "RUN_ID_LINE",
    "TRACE_RUN_ID_KEY",
    "TRACE_WORLD_SIZE_KEY",
    "MEMORY_CATEGORIES_FORMAT",
    "CUDA_ALLOC_WINDOW_FORMAT",
    "CALL_MARK",
    "CALL_MARK_PREFIX",
}


def _file_templates() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(layout).items()
        if name.isupper() and isinstance(value, str) and name not in NOT_FILES
    }


@pytest.mark.parametrize("name", sorted(_file_templates()))
def test_every_layout_name_round_trips_through_the_loader(name):
    # GIVEN a name built from a layout.py template (reports are a .yaml and a .log)
    template = _file_templates()[name]
    suffixes = [".yaml", ".log"] if name.endswith("_REPORT") else [""]
    for suffix in suffixes:
        fields = {k: v for k, v in SAMPLE.items() if "{" + k + "}" in template}
        filename = template.format(**fields) + suffix
        # WHEN parsed THEN the loader knows its kind and reads back every field
        parsed = parse_name(filename)
        assert parsed is not None, filename
        assert parsed[1] == fields
        assert artifacts.NAME_PATTERNS[parsed[0]].pattern.startswith("^")


def test_newest_run_is_read_by_manifest_start(tmp_path):
    # GIVEN a save_dir with a first run, and a second one in version_1 started later
    write_run(tmp_path, stats([1]), {"run_id": "a", "started": "2026-01-02T10:00:00+00:00"})
    write_run(tmp_path / "version_1", stats([5]), {"run_id": "b", "started": "2026-01-02T11:00:00+00:00"})
    # make the older run's files newer on disk: the manifest decides, not mtime
    os.utime(tmp_path / "rank_0_memory_stats.yaml", (2e9, 2e9))
    # WHEN loaded
    run = load_run(tmp_path)
    # THEN the newest is read, and the selection line says which and how to read the other
    assert run.root == tmp_path / "version_1"
    assert list(run.stats[0]) == ["0.training_step.5.start", "0.training_step.5.end"]
    assert run.selection == (
        f"{tmp_path} holds 2 runs; reading the newest, {tmp_path / 'version_1'} (started 2026-01-02 "
        f"11:00:00 UTC); pass another's directory to read it: {tmp_path}"
    )


def test_runs_without_manifest_are_ordered_by_file_time(tmp_path):
    old = write_run(tmp_path / "lightning_logs" / "version_0" / "memprofiler", stats([1]))
    new = write_run(tmp_path / "lightning_logs" / "version_1" / "memprofiler", stats([2]))
    os.utime(old / "rank_0_memory_stats.yaml", (1e9, 1e9))
    os.utime(new / "rank_0_memory_stats.yaml", (1.5e9, 1.5e9))
    assert [r.path for r in find_runs(tmp_path)] == [old, new]
    assert load_run(tmp_path).root == new


def test_manifest_notes_are_kept(tmp_path):
    write_run(tmp_path, stats([1]), {"run_id": "a", "notes": ["`train_step` was never called"]})
    run = load_run(tmp_path)
    assert run.notes == ["`train_step` was never called"] and run.selection is None


def test_merged_node_directories_keep_the_manifest_notes_and_every_rank():
    # GIVEN rank 0's node with the manifest (and a note), rank 1's node with a streamed file
    from memprofiler.analysis.runs.artifacts import RunArtifacts
    from memprofiler.analysis.runs.multi_dir import merge_runs

    node0 = RunArtifacts(
        root=Path("n0"), stats={0: {"0.f.1.end": {"rss": 1}}}, manifest={"notes": ["`g` was never called"]}
    )
    node1 = RunArtifacts(root=Path("n1"), stats_files={1: Path("n1/rank_1_memory_stats.yaml")})
    # WHEN merged
    merged = merge_runs([("n1", node1), ("n0", node0)])
    # THEN the notes a report prints survive, and both ranks are there
    assert merged.notes == ["`g` was never called"]
    assert merged.ranks == [0, 1] and merged.stats_files == {1: Path("n1/rank_1_memory_stats.yaml")}


def test_a_folder_without_memprofiler_files_is_its_own_kind_of_error_even_named_by_url(tmp_path, monkeypatch):
    from memprofiler.analysis.files import fs
    from memprofiler.errors import NoRunFilesError

    # GIVEN an empty folder, once read as itself and once as the local copy of a URL
    copy = tmp_path / "copy"
    copy.mkdir()
    with pytest.raises(NoRunFilesError, match="no memprofiler files found"):
        find_runs(copy)
    monkeypatch.setitem(fs._copies, "s3://bucket/run", copy)
    # THEN the message names the URL and the error keeps its kind
    with (
        pytest.raises(NoRunFilesError, match=r"^s3://bucket/run: no memprofiler files found"),
        fs.named_as_given(),
    ):
        find_runs(copy)
