"""Load a repository script (``tools/``, ``benchmarks/``) by its path, as tests exercise them: not
by putting its folder on ``sys.path``, where ``benchmarks/estimate.py`` would shadow the tests'
own packages."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """``ROOT / relative`` as module ``name`` (default: the file's stem), registered in
    ``sys.modules`` before it runs (its dataclasses look their module up there)."""
    path = ROOT / relative
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
