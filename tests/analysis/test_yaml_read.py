"""The YAML reader: integrity lines, cut files, and the fast reader agreeing with ``yaml.safe_load``."""

from __future__ import annotations

import pytest
import yaml

from memprofiler import layout
from memprofiler.analysis.files.yaml_read import Cut, _fast_mapping, read_yaml
from memprofiler.errors import ArtifactError
from v1_files import stats, v1_text


def test_intact_file_reads_every_entry(tmp_path):
    # GIVEN a v1 file of two blocks
    entries = stats([1, 2])
    path = tmp_path / "rank_0_memory_stats.yaml"
    path.write_text(v1_text(entries, [2, 2]))
    cuts: list[Cut] = []
    # THEN it reads back equal, nothing cut
    assert read_yaml(path, cuts) == entries
    assert cuts == []


def test_number_cut_mid_way_is_never_read_back_shorter(tmp_path):
    # GIVEN a file killed while appending its second block, in the middle of 74880
    first = stats([1])
    text = v1_text(first, [2]) + yaml.safe_dump({"0.training_step.2.start": {"rss": 74880}})
    path = tmp_path / "rank_0_memory_stats.yaml"
    path.write_text(text[:-2])  # "...rss: 7488"
    cuts: list[Cut] = []
    # WHEN read
    data = read_yaml(path, cuts)
    # THEN only the verified block is kept, and the cut names the file and what was dropped
    assert data == first
    assert cuts == [Cut(path, kept=2, dropped_lines=2, dropped_entries=1)]
    assert cuts[0].line() == (
        f"{path}: cut short (copied partially or its writer was killed); read the 2 verified entries, "
        "dropped 1 entry (2 lines) after the last `#memprofiler-end entries=2`"
    )
    # AND without a place to record it, the file is refused
    with pytest.raises(ArtifactError, match="cut short"):
        read_yaml(path)


def test_block_end_with_a_wrong_count_is_not_trusted(tmp_path):
    # GIVEN a last block-end whose count does not match the entries above it
    text = v1_text(stats([1]), [2]) + yaml.safe_dump(stats([2])) + layout.YAML_BLOCK_END.format(n=3) + "\n"
    path = tmp_path / "s.yaml"
    path.write_text(text)
    cuts: list[Cut] = []
    # THEN only what lies before the last matching one is read
    assert read_yaml(path, cuts) == stats([1])
    assert (cuts[0].kept, cuts[0].dropped_entries) == (2, 2)


def test_header_without_any_matching_block_end_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(layout.YAML_HEADER + "\n" + yaml.safe_dump(stats([1])))
    with pytest.raises(ArtifactError) as err:
        read_yaml(path, [])
    assert str(err.value) == (
        f"{path}: starts with `#memprofiler-yaml v1` but has no matching `#memprofiler-end entries=<n>` line: "
        "the file was cut before its first block was complete; re-copy it or re-run"
    )


def test_older_file_without_header_reads_as_before(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(stats([1, 2])))
    cuts: list[Cut] = []
    assert read_yaml(path, cuts) == stats([1, 2]) and cuts == []


@pytest.mark.parametrize(
    "text",
    [
        "0.training_step.2.end:\n  rss: 5\n  saved_tensors.by_module:\n    (outside forward): 7\n    enc.0: 0\n",
        "0.a.1.end: {}\n0.a.1.start:\n  rss: -3\n  x: 1.5e+20\n  y: .inf\n  z: .nan\n  w: 2.0\n",
        "0.a.1.end:\n  nested:\n  after: 1\n0.a.2.end:\n",
        "0.fee.1.end:\n  rss: 1\n",  # a function name of hex digits: resolved by PyYAML's rules
    ],
)
def test_fast_reader_agrees_with_safe_load(text):
    fast = _fast_mapping(text)
    assert fast is not None
    assert repr(fast) == repr(yaml.safe_load(text))  # repr: nan == nan fails, its repr does not


@pytest.mark.parametrize(
    "text",
    [
        "yes:\n  rss: 1\n",  # a boolean key
        "0.a.1.end:\n  rss: 0x1f\n",  # a hex number
        "0.a.1.end:\n  rss: 017\n",  # YAML 1.1 octal
        "0.a.1.end:\n  rss: 1_000\n",
        "0.a.1.end:\n  name: text\n",
        "'0.a.1.end':\n  rss: 1\n",
        "0.a.1.end:\n  rss: 1 # comment\n",
        "0.a.1.end:\n  a:\n    b:\n      c: 1\n",
        "0.a.1.end:\n  12: 1\n",
    ],
)
def test_fast_reader_leaves_anything_else_to_yaml(text):
    # THEN the shape is declined, so the YAML loader (same answer as safe_load) reads it
    assert _fast_mapping(text) is None


FLOW = (
    '0.training_step.1.start: {"rss": 5, "t": 1.0e-05}\n'
    '0.training_step.1.end: {"rss": 7, "saved_tensors.by_module": {"(outside forward)": 1, "enc.0": 0}, '
    '"x": 1.5e+20, "ok": true, "n": null, "s": "a: b # c"}\n'
    "0.training_step.2.end: {}\n"
    '0.training_step.1.start: {"rss": 9}\n'  # a repeated key: YAML keeps the first place, last value
)


@pytest.mark.parametrize(
    "text",
    [
        FLOW,
        "#memprofiler-yaml v1\n" + FLOW + "#memprofiler-end entries=4\n",
        FLOW + "0.a.1.end:\n  rss: 5\n  by:\n    m: 1\n",  # one block entry among JSON lines
        '0.a.1.end: {"l": [1, 2.5, "s", null], "m": {"k": [{"a": 1}, {"b": 2}]}}\n',  # arrays
        'yes_key.1: {"rss": 1}\n',  # a key starting with a letter: checked one by one
    ],
)
def test_json_lines_read_as_safe_load_reads_them(text):
    fast = _fast_mapping(text)
    assert fast is not None
    assert repr(fast) == repr(yaml.safe_load(text))


@pytest.mark.parametrize(
    "text",
    [
        '0.a.1.end: {"x": 1e5}\n',  # a string to YAML 1.1, a float to JSON
        '0.a.1.end: {"x": 1.0e5}\n',  # YAML 1.1 wants a signed exponent
        '0.a.1.end: {"x": NaN}\n',
        '0.a.1.end: {"x": 1} # comment\n',
        "0.a.1.end: {x: 1}\n",  # YAML's flow mapping, not JSON
        '0.a.1.end: {"x": "\\ud83d\\ude00"}\n',  # JSON joins the pair, YAML decodes each half
        '0.a.1.end: {"x": "é"}\n',
        '0.a.1.end: {"x": 1,\n  "y": 2}\n',  # a flow mapping over two lines
        '0.a.1.end: {"x": 1}, {"y": 2}\n',  # two JSON values on one line
        '0.a.1.end: {"x": [1}\n0.a.2.end: {"y": 2]}\n',
        '"0.a.1.end": {"x": 1}\n',
        'true: {"x": 1}\n',
    ],
)
def test_json_lines_yaml_reads_otherwise_go_to_the_yaml_loader(text):
    assert _fast_mapping(text) is None


def test_profiler_written_file_reads_back_through_the_json_path(tmp_path):
    # GIVEN a stats file as the profiler appends it: two flushes
    from memprofiler.output.stats_file import StatsFile

    snaps = {
        f"0.training_step.{i}.end": {"rss": 1000 + i, "t": i * 1e-6, "by": {"m.0": i}} for i in range(1, 5)
    }
    f = StatsFile(tmp_path / "rank_0_memory_stats.yaml")
    f.flush(snaps, list(snaps)[:2])
    f.flush(snaps, list(snaps)[2:])
    text = f.path.read_text()
    # THEN each entry is one line, the fast reader reads it, and equals safe_load and the input
    assert text.count("0.training_step.") == 4 and "\n  " not in text
    assert read_yaml(f.path) == yaml.safe_load(text) == snaps


def test_brackets_in_quoted_names_do_not_count_as_nesting(tmp_path):
    # GIVEN 3,000 entries whose module names hold unbalanced brackets, in quotes, and a NaN
    # (block style) among them, so the file goes to the YAML loader and its depth check
    lines = [layout.YAML_HEADER]
    for i in range(3000):
        lines.append(f'0.f.{i}.end: {{"saved_tensors.by_module": {{"m[{i}": {i}, "n{{": 1}}}}')
    lines += [
        "0.f.3000.end:",
        "  rss: .nan",
        "0.f.3001.end: {'quoted [': 1}",
        "#memprofiler-end entries=3002",
    ]
    path = tmp_path / "rank_0_memory_stats.yaml"
    path.write_text("\n".join(lines) + "\n")
    # THEN it reads as safe_load reads it
    data = read_yaml(path)
    assert data["0.f.2999.end"] == {"saved_tensors.by_module": {"m[2999": 2999, "n{": 1}}
    assert data["0.f.3001.end"] == {"quoted [": 1} and len(data) == 3002


def test_indentation_no_writer_makes_is_refused(tmp_path):
    path = tmp_path / "memory_summary.yaml"
    path.write_text("a:\n" + " " * 4000 + "b: 1\n")
    with pytest.raises(ArtifactError, match="refused: nested deeper than any file"):
        read_yaml(path)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('0.f.1.end: {"rss": ' + "1" * 5000 + "}", "Exceeds the limit (4300 digits)"),  # JSON, then YAML
        ("0.f.1.end:\n  rss: " + "1" * 5000, "Exceeds the limit (4300 digits)"),
        ("0.f.1.end:\n  when: 2020-13-45", "month must be in 1..12"),  # a timestamp YAML cannot build
    ],
)
def test_values_python_cannot_build_are_one_line(tmp_path, body, why):
    # GIVEN an entry YAML parses but Python cannot build (once a ValueError traceback)
    path = tmp_path / "rank_0_memory_stats.yaml"
    path.write_text(f"{layout.YAML_HEADER}\n{body}\n#memprofiler-end entries=1\n")
    # THEN one line naming the file and the value's problem
    with pytest.raises(ArtifactError) as info:
        read_yaml(path)
    message = str(info.value)
    assert message.startswith(f"{path}: holds a value that cannot be read ({why}")
    assert message.endswith("); foreign or edited file?") and "\n" not in message
