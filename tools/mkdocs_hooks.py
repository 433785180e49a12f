"""MkDocs hooks: pages generated from the code, so they cannot drift from it.

- ``<!-- config-reference -->``: the config tables, from the config dataclasses' field docstrings
  (:mod:`memprofiler.config.reference`).
- ``<!-- config-defaults -->``: every config key with its default, as YAML.
- ``<!-- memprofiler-help NAME -->``: ``memprofiler NAME --help``, from the command's own parser.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

_HELP = re.compile(r"<!-- memprofiler-help ([a-z-]+) -->")


def _use_this_checkout() -> None:
    """Import memprofiler from this checkout's ``src``, whatever the environment has installed.

    Done at page time: MkDocs restores ``sys.path`` after loading a hook module.
    """
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    loaded = sys.modules.get("memprofiler")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(SRC)):
        for name in [n for n in sys.modules if n == "memprofiler" or n.startswith("memprofiler.")]:
            del sys.modules[name]


def command_help(name: str) -> str:
    """``memprofiler NAME --help`` at a fixed width."""
    _use_this_checkout()
    os.environ["COLUMNS"] = "100"
    from memprofiler.__main__ import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    choices: dict[str, Any] = sub.choices  # type: ignore[assignment]
    if name not in choices:
        raise ValueError(f"<!-- memprofiler-help {name} -->: no such subcommand; have {', '.join(choices)}")
    return str(choices[name].format_help())


def expand(markdown: str) -> str:
    """Replace every generator marker in ``markdown`` with what it stands for."""
    _use_this_checkout()
    from memprofiler.config.reference import default_yaml, render_markdown

    if "<!-- config-reference -->" in markdown:
        markdown = markdown.replace("<!-- config-reference -->", render_markdown())
    if "<!-- config-defaults -->" in markdown:
        markdown = markdown.replace("<!-- config-defaults -->", f"```yaml\n{default_yaml()}```")
    return _HELP.sub(lambda m: f"```text\n{command_help(m.group(1))}```", markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand(markdown)
