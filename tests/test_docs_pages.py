"""The README stays a front page, its links resolve, and every docs page is in the site's nav.

The site itself is built by ``make docs`` (MkDocs, ``--strict``), which checks links inside
``docs/``; these checks cover what it does not see: the README as GitHub renders it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
