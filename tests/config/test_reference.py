"""The generated config reference: every field of the config tree, with its docstring and default."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml

from _scripts import load_script
from memprofiler.config import MemProfilerConfig
from memprofiler.config.reference import config_fields, default_yaml, field_docstrings, render_markdown

ROOT = Path(__file__).resolve().parents[2]


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree, walked with ``dataclasses`` (independently of the generator)."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        keys.append(f"{prefix}{f.name}")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            keys.extend(_all_keys(tp, f"{prefix}{f.name}."))
    return keys


def test_every_field_of_the_config_tree_is_in_the_reference_with_a_docstring() -> None:
    keys = _all_keys(MemProfilerConfig)
    page = render_markdown()
    assert [f.key for f in config_fields()] == keys
    missing_doc = [f.key for f in config_fields() if not f.doc]
    assert missing_doc == [], f"config fields without a docstring: {missing_doc}"
    missing_row = [k for k in keys if f"| `{k}` |" not in page]
    assert missing_row == []
    assert len(keys) > 40  # the tree is walked into every nested config


def test_a_row_holds_the_type_default_and_docstring_of_its_field() -> None:
    page = render_markdown()
    assert "| `schedule.active` | `int` | `1` | Collected calls per cycle. |" in page
    assert "| `save_dir` | `str` or `None` | `null` |" in page
    assert "| `oom` | `OomConfig` | see [`oom`](#oom) | The OOM flight recorder. |" in page
    # Sphinx roles become code spans
    assert ":class:" not in page and "`ExtendedPyTorchProfiler`" in page


def test_field_docstrings_are_the_strings_under_each_field() -> None:
    @dataclasses.dataclass
    class Example:
        a: int = 1
        """First."""
        b: str = "x"
        c: bool = False
        """Third,
        on two lines."""

    assert field_docstrings(Example) == {"a": "First.", "c": "Third,\non two lines."}


def test_the_default_yaml_loads_back_into_the_default_config() -> None:
    loaded = yaml.safe_load(default_yaml())
    assert MemProfilerConfig.from_any(loaded).to_dict() == MemProfilerConfig().to_dict()


def test_the_docs_hook_expands_every_marker() -> None:
    hooks = load_script("tools/mkdocs_hooks.py")
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    out = hooks.expand(page + "\n<!-- memprofiler-help check -->\n")
    assert "<!--" not in out
    assert "| `schedule.active` |" in out
    assert "usage: memprofiler check" in out
