"""Every benchmark result is a record a reader can trust: named by benchmark, hardware and date,
with commit, date, hardware and command inside, in the one schema of ``benchmarks/_emit.py``;
and every result the docs cite is there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
_emit = load_script("benchmarks/_emit.py")

RESULTS = ROOT / "benchmarks" / "results"
CITED = re.compile(r"benchmarks/results/([A-Za-z0-9_.*-]+)")


def _record_file(entry: Path) -> Path:
    return entry / "record.json" if entry.is_dir() else entry


@pytest.mark.parametrize("entry", sorted(p.name for p in RESULTS.iterdir()))
def test_each_result_is_named_and_recorded_in_the_one_schema(entry):
    path = RESULTS / entry
    stem = entry.removesuffix(".json")
    named = _emit.NAME.match(stem)
    assert named, f"{entry}: name it <benchmark>_<hardware>_<yyyymmdd>"
    rec = json.loads(_record_file(path).read_text())
    assert tuple(rec) == _emit.KEYS, entry
    assert rec["benchmark"] == named["benchmark"] and rec["hardware"] == named["hardware"], entry
    assert rec["date"].replace("-", "") == named["date"], entry
    assert re.fullmatch(r"[0-9a-f]{7,40}\+?", rec["commit"]), entry
    assert rec["command"].startswith(("python ", "tools/")), entry


def _cited() -> dict[str, list[str]]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    found: dict[str, list[str]] = {}
    for f in tracked:
        # What a reader is pointed to: the docs and the code; a script's usage line names where
        # its own output will go.
        if not f.startswith(("docs/", "src/", "tests/")) and f not in ("README.md", "ARCHITECTURE.md"):
            continue
        if not f.endswith((".py", ".md")):
            continue
        for name in CITED.findall((ROOT / f).read_text(encoding="utf-8")):
            found.setdefault(name.rstrip("."), []).append(f)
    return found


#: Cited before the benchmark's record was committed: the docs name the file the benchmark will write.
NOT_YET_RECORDED: set[str] = set()


def test_every_cited_result_exists():
    missing = []
    for name, where in sorted(_cited().items()):
        if "*" in name or "<" in name or "YYYYMMDD" in name:  # a pattern, not a file
            continue
        assert _emit.NAME.match(name.removesuffix(".json").split("/")[0]), f"{name}: not a result's name"
        if not (RESULTS / name).exists() and name not in NOT_YET_RECORDED:
            missing.append(f"{name} (cited in {', '.join(sorted(set(where)))})")
    assert missing == []


def test_emit_writes_a_named_record(tmp_path, monkeypatch, capsys):
    # GIVEN a benchmark's figures, emitted into a results folder
    monkeypatch.setattr(sys, "argv", ["benchmarks/scaling.py", "--out", str(tmp_path)])
    monkeypatch.setattr(_emit, "hardware", lambda: "cpu")
    _emit.emit({"ratio": 1.02}, tmp_path)
    # THEN one file is written, named by benchmark, hardware and date, in the schema
    (written,) = tmp_path.iterdir()
    rec = json.loads(written.read_text())
    assert written.name == f"scaling_cpu_{rec['date'].replace('-', '')}.json"
    assert tuple(rec) == _emit.KEYS
    assert rec["command"] == f"python benchmarks/scaling.py --out {tmp_path}"
    assert rec["result"] == {"ratio": 1.02}
    assert _emit.read_result(written) == {"ratio": 1.02}
    assert json.loads(capsys.readouterr().out) == rec
