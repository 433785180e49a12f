"""The repository speaks of the project alone: no file tells how it was made (a numbered work
session, the syntax of a tool outside the project, a reader or helper named by its history, a
path of the machine it was made on). CHANGELOG.md's dated entries are history and are left out."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: How the making of a project shows in its files. Each pattern is written so that it does not
#: match itself.
FORBIDDEN = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bsession [0-9]+\b",
        r"\b(this|previous|earlier|next|last) sess[i]on\b",
        r"\bsession's shared\b",
        r"\bhe[l]d reader\b",
        r"\bbefore th[i]s change\b",
        r"\brun\(comm[a]nd=",
        r"\bcar[r]y=\[",
        r"\bthe he[l]per\b",
        r"\bhelper's jobs\b",
        r"\bwork[t]ree\b",
        r"\bengine[e]r [0-9]+\b",
        r"\bthe le[a]d\b",
        r"\.\./sha[r]ed/",
        r"/wor[k]/(main|wt)\b",
        r"\bfarm-stu[d]io\b",
    )
]
#: A dated CHANGELOG entry (``## [0.1.0] - 2026-11-28``): from there on, history.
DATED = re.compile(r"^## \[[^\]]+\] - \d{4}-\d{2}-\d{2}", re.MULTILINE)


def _text(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary (a pickle, a gzip) or gone
    if path.name == "CHANGELOG.md":
        dated = DATED.search(text)
        return text[: dated.start()] if dated else text
    return text


def findings(root: Path, files: list[str]) -> list[str]:
    """``file:line: text`` of every line under ``root`` matching a forbidden pattern."""
    out = []
    for name in files:
        text = _text(root / name)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in FORBIDDEN):
                out.append(f"{name}:{n}: {line.strip()[:120]}")
    return out


def _tracked() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    return [f for f in listed if (ROOT / f).is_file() and f != "tests/test_speaks_of_itself.py"]


def test_no_file_tells_how_the_project_was_made():
    assert findings(ROOT, _tracked()) == []


def test_a_planted_word_is_found(tmp_path):
    # GIVEN a tree with a file that tells of its making, a clean file, and a changelog whose
    # dated entry (history) says the same
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "probe.sh").write_text("# ran it in sess" + "ion 14:\n#   run(comm" + 'and="x")\n')
    (tmp_path / "clean.md").write_text("Each pytest session writes one results file.\n")
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2026-11-28\n\n- from sess" + "ion 3 on.\n"
    )
    # WHEN the tree is read
    found = findings(tmp_path, ["tools/probe.sh", "clean.md", "CHANGELOG.md"])
    # THEN both lines of the planted file are named, and nothing else
    assert found == [
        "tools/probe.sh:1: # ran it in sess" + "ion 14:",
        "tools/probe.sh:2: #   run(comm" + 'and="x")',
    ]
    # AND the same words under [Unreleased] are found
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n## [Unreleased]\n\n- see the he" + "ld reader\n")
    assert findings(tmp_path, ["CHANGELOG.md"]) == ["CHANGELOG.md:5: - see the he" + "ld reader"]
