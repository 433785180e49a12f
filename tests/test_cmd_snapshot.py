"""``memprofiler snapshot`` on hand-built allocator snapshots with known answers."""

from __future__ import annotations

import pickle

import pytest

from memprofiler.__main__ import main
from snapshot_fixtures import known_snapshot


@pytest.fixture
def snap_file(tmp_path):
    p = tmp_path / "cuda_alloc_rank_0.training_step.2.end.pickle"
    p.write_bytes(pickle.dumps(known_snapshot(), protocol=4))
    return p


def test_prints_peaks_stacks_fragmentation_and_oom(snap_file, capsys):
    assert main(["snapshot", str(snap_file)]) == 0
    out = capsys.readouterr().out
    assert "now: 3 segments, reserved 4.00 MiB, allocated 1.75 MiB" in out
    assert (
        "device 0: 12 trace entries; peak allocated 2.25 MiB (entry 5, t=0.000140s); "
        "peak reserved 6.00 MiB (entry 10, t=0.000180s)"
    ) in out
    assert "live at the allocated peak by stack (5 blocks)" in out
    stack_lines = [ln for ln in out.splitlines() if "linear_forward (linear_forward.py:10)" in ln]
    assert len(stack_lines) == 1 and "1.25 MiB" in stack_lines[0]
    assert "OOM device 0 entry 9 t=0.000170s: 8.00 GiB requested, 1000 B free" in out
    assert "33.3%" in out


def test_html_page(snap_file, tmp_path, capsys):
    out = tmp_path / "snap.html"
    assert main(["snapshot", str(snap_file), "--html", str(out), "--top", "2"]) == 0
    html = out.read_text()
    assert "Peak allocated <span title='2,359,296 bytes'>2.25 MiB</span>" in html
    assert html.count("<svg") == 1
    assert "(top 2)" in html


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"", "file is empty"),
        (pickle.dumps(known_snapshot(), protocol=4)[:500], "truncated"),
        (b"PK\x03\x04 a zip file", "is a zip archive"),
        (b"hello: yaml\n", "not a pickle file"),
        (pickle.dumps({"a": 1}), "not a CUDA allocator snapshot"),
        (b"cposix\nsystem\n(S'true'\ntR.", "refused to load"),
    ],
)
def test_bad_files_are_one_line_exit_2(tmp_path, capsys, content, message):
    p = tmp_path / "x.pickle"
    if content is not None:
        p.write_bytes(content)
    assert main(["snapshot", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(p) in err
