"""A Hugging Face model directory holding only its ``config.json``, as `memprofiler estimate` reads one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def config_dir(root: Path, name: str, config: dict[str, Any]) -> Path:
    """``root/name/config.json`` written from ``config``; the directory."""
    (root / name).mkdir()
    (root / name / "config.json").write_text(json.dumps(config))
    return root / name
