"""The README stays a front page, its links resolve, and every docs page is in the site's nav.

The site itself is built by ``make docs`` (MkDocs, ``--strict``), which checks links inside
``docs/``; these checks cover what it does not see: the README as GitHub renders it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
#: The README is a front page: what it is, set-up, quick starts, a picture and links.
README_MAX_LINES = 250
_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _nav_pages(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, "move the detail into a page under docs/ and link it"


def test_every_relative_link_of_the_readme_resolves() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [m.group(1) for m in _LINK.finditer(text) if "://" not in m.group(1)]
    assert "docs/getting-started.md" in targets and "docs/img/report.png" in targets
    assert [t for t in targets if not (ROOT / t).exists()] == []


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = set(_nav_pages(config["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - nav == set()
    assert nav - pages == set()


#: A Sphinx role as the API page would show it raw: ``:class:`X``` or, once rendered, ``:class:<code>``.
_RAW_ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|data|attr|exc|obj):(?:`|<code>)")


@pytest.mark.slow
def test_the_built_api_page_shows_no_raw_sphinx_role(tmp_path: Path) -> None:
    """tools/griffe_sphinx_roles.py turns the docstrings' roles into code and links to the shown objects."""
    pytest.importorskip("mkdocstrings_handlers.python")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "site" / "reference" / "api.html").read_text(encoding="utf-8")
    assert _RAW_ROLE.findall(page) == []
    # :meth:`bind` in MemProfiler's docstring is a link to the method's own entry.
    assert 'href="#memprofiler.core.profiler.MemProfiler.bind"><code>bind</code></a>' in page
