"""The stats file read a verified block at a time agrees with the whole-file reader."""

from __future__ import annotations

import math

import pytest
import yaml

from memprofiler import layout
from memprofiler.analysis.files.yaml_read import Cut, read_yaml
from memprofiler.analysis.runs.stats_stream import iter_stats
from memprofiler.errors import ArtifactError
from memprofiler.output.stats_file import entry_yaml
from v1_files import stats, v1_text


def _merged(path, cuts):
    out = {}
    blocks = list(iter_stats(path, cuts))
    for block in blocks:
        out.update(block)
    return out, blocks


def _one_line_file(entries, every=2):
    """``entries`` as the profiler writes them now: one line each, a block-end every ``every``."""
    lines = [layout.YAML_HEADER + "\n"]
    for n, (key, metrics) in enumerate(entries.items(), start=1):
        lines.append(entry_yaml(key, metrics))
        if n % every == 0 or n == len(entries):
            lines.append(layout.YAML_BLOCK_END.format(n=n) + "\n")
    return "".join(lines)


@pytest.mark.parametrize("style", ["one_line", "block", "mixed", "older"])
def test_blocks_add_up_to_what_the_whole_file_reader_reads(tmp_path, style):
    # GIVEN 300 calls in each style the readers know (mixed: a NaN entry in block style)
    entries = stats(range(1, 301))
    entries["0.training_step.7.end"]["saved_tensors.by_module"] = {"enc.0": 4096, "(outside forward)": 8}
    if style == "mixed":
        entries["0.training_step.9.end"]["rss_peak"] = math.nan
    path = tmp_path / "rank_0_memory_stats.yaml"
    if style == "older":
        path.write_text(yaml.safe_dump(entries, sort_keys=False))
    elif style == "block":
        path.write_text(v1_text(entries, [100] * 6))
    else:
        path.write_text(_one_line_file(entries, every=100))
    cuts: list[Cut] = []
    # WHEN streamed
    merged, blocks = _merged(path, cuts)
    # THEN the same mapping, in the same order, a block (100 entries) at a time but the older file
    assert repr(merged) == repr(read_yaml(path)) and list(merged) == list(entries)
    assert [len(b) for b in blocks] == ([600] if style == "older" else [100] * 6)
    assert cuts == []


def test_a_cut_file_yields_its_verified_blocks_and_records_the_same_cut(tmp_path):
    # GIVEN a file killed mid-append, in the middle of 74880
    text = _one_line_file(stats([1, 2]), every=2) + entry_yaml("0.training_step.3.start", {"rss": 74880})
    path = tmp_path / "rank_0_memory_stats.yaml"
    path.write_text(text[:-3])
    # WHEN streamed
    cuts: list[Cut] = []
    merged, _ = _merged(path, cuts)
    # THEN what the whole-file reader keeps, and the same cut
    whole: list[Cut] = []
    assert merged == read_yaml(path, whole) == stats([1, 2])
    assert cuts == whole == [Cut(path, kept=4, dropped_lines=1, dropped_entries=1)]


def test_no_matching_block_end_is_the_same_error(tmp_path):
    path = tmp_path / "rank_0_memory_stats.yaml"
    path.write_text(layout.YAML_HEADER + "\n" + yaml.safe_dump(stats([1])))
    with pytest.raises(ArtifactError) as streamed:
        list(iter_stats(path, []))
    with pytest.raises(ArtifactError) as whole:
        read_yaml(path, [])
    assert str(streamed.value) == str(whole.value)


def test_a_bad_line_in_a_later_block_is_named_by_its_line_in_the_file(tmp_path):
    # GIVEN invalid YAML on line 9 of the file, in its third block
    lines = _one_line_file(stats([1, 2, 3]), every=2).splitlines(keepends=True)
    lines[8] = "0.training_step.3.end: {rss: [\n"
    path = tmp_path / "rank_0_memory_stats.yaml"
    path.write_text("".join(lines))
    # THEN the streamed reader says what the whole-file reader says
    with pytest.raises(ArtifactError) as streamed:
        list(iter_stats(path, []))
    with pytest.raises(ArtifactError) as whole:
        read_yaml(path, [])
    assert str(streamed.value) == str(whole.value)
    assert "not valid YAML at line" in str(streamed.value)


def test_missing_and_empty_files_are_one_line(tmp_path):
    with pytest.raises(ArtifactError, match="no such file"):
        list(iter_stats(tmp_path / "nope.yaml", []))
    empty = tmp_path / "rank_0_memory_stats.yaml"
    empty.write_text("")
    with pytest.raises(ArtifactError, match="file is empty"):
        list(iter_stats(empty, []))


def test_unreadable_files_are_one_line(tmp_path):
    # GIVEN a directory where the file should be, and bytes that are not text
    folder = tmp_path / "rank_0_memory_stats.yaml"
    folder.mkdir()
    binary = tmp_path / "rank_1_memory_stats.yaml"
    binary.write_bytes(layout.YAML_HEADER.encode() + b'\n0.f.1.end: {"rss": 1}\n\xff\xfe\n')
    # THEN each is the whole-file reader's one line, not a traceback
    for path in (folder, binary):
        with pytest.raises(ArtifactError, match="cannot read as text"):
            list(iter_stats(path, []))
