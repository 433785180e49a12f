"""What every benchmark ends with: the machine it ran on, and its JSON printed (and saved)."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, str]:
    """Versions and machine, for the record beside the figures."""
    info = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def emit(result: dict[str, Any], out: Path | None) -> None:
    """Print ``result`` with :func:`machine_info` as indented JSON; also write it to ``out``."""
    text = json.dumps({**result, **machine_info()}, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
