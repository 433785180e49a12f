"""Scripts and styles are package files (``reporters/assets/``), never long Python strings, and a
script gets its data from the page's JSON, never by text put into it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

from memprofiler.reporters.parts.assets import asset

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "memprofiler"
ASSETS = SRC / "reporters" / "assets"
#: Lines a Python string may hold of script or style before it belongs in a file.
MOST_CODE_LINES = 20
# A line of JavaScript or CSS ends a statement or opens or closes a block.
_CODE_LINE = re.compile(r"[;{}]\s*(//.*)?$")


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal in a module (an f-string's literal parts joined), with its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            found.append((node.lineno, "{}".join(parts)))
    return found


def long_code_strings(root: Path) -> list[str]:
    """``file:line`` of each string under ``root`` holding more than MOST_CODE_LINES lines of code."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            code = sum(bool(_CODE_LINE.search(s)) for s in text.splitlines())
            if code > MOST_CODE_LINES:
                out.append(f"{path.relative_to(root)}:{line} ({code} lines of script or style)")
    return out


def test_no_python_string_in_src_holds_a_script_or_a_style():
    assert long_code_strings(SRC) == []


def test_a_planted_script_string_is_found(tmp_path):
    # GIVEN a module holding 21 lines of JavaScript in a string, and one holding 20
    js = "\n".join(f"  var x{i} = {i};" for i in range(21))
    (tmp_path / "page.py").write_text(f'SCRIPT = """\n{js}\n"""\n')
    (tmp_path / "short.py").write_text(f'STYLE = f"""\n{{x}}{js.split(chr(10), 1)[1]}\n"""\n')
    # THEN the long one is named, the one at the limit is not
    assert long_code_strings(tmp_path) == ["page.py:1 (21 lines of script or style)"]


@pytest.mark.parametrize("name", sorted(p.name for p in ASSETS.iterdir()))
def test_every_asset_is_read_by_name_and_used(name):
    # GIVEN a file of reporters/assets/
    # THEN it loads through the package's resources, and the source names it
    assert asset(name) == (ASSETS / name).read_text(encoding="utf-8")
    users = [p for p in SRC.rglob("*.py") if f'asset("{name}")' in p.read_text(encoding="utf-8")]
    assert users, f"{name} is used nowhere"


def test_no_asset_is_filled_by_text_substitution():
    # A placeholder (`%(x)d`, `{x}`, `$x`) in a script would mean the page's data is pasted into it.
    for path in ASSETS.iterdir():
        assert not re.search(r"%\(\w+\)[ds]|\{\{\s*\w+\s*\}\}", path.read_text(encoding="utf-8")), path.name
    reporters = "\n".join(p.read_text(encoding="utf-8") for p in (SRC / "reporters").rglob("*.py"))
    assert not re.search(r'asset\("[^"]+"\)\s*\.(replace|format)\(', reporters)


def test_the_wheel_ships_every_asset():
    # GIVEN the package data setuptools puts in the wheel
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for g in globs["memprofiler"] for p in SRC.glob(g)}
    # THEN every asset file is among them
    assert set(ASSETS.iterdir()) <= shipped
