"""Atomic writers for the plain files memprofiler produces (YAML, pickle, text, JSON)."""

from __future__ import annotations

import enum
import json
import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

#: memory_viz rejects pickle protocol 5 ("Unhandled version 5"), the newer Pythons' default.
PICKLE_PROTOCOL = 4


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``.

    A reader never sees a half-written file, and a crash mid-write leaves the old file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def to_plain(obj: Any) -> Any:
    """Convert to data ``yaml.safe_load`` reads back: dicts, lists, str, int, float, bool."""
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_plain(v) for v in obj]
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, enum.Enum):
        return to_plain(obj.value)
    # Subclasses (numpy scalars, IntEnum-like types) are not representable by safe_dump.
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        return to_plain(item())
    return str(obj)


def write_yaml(path: str | os.PathLike[str], data: Any) -> Path:
    text = yaml.safe_dump(to_plain(data), sort_keys=False, default_flow_style=False)
    return atomic_write_bytes(path, text.encode())


def write_pickle(path: str | os.PathLike[str], data: Any, plain: bool = True) -> Path:
    payload = to_plain(data) if plain else data
    return atomic_write_bytes(path, pickle.dumps(payload, protocol=PICKLE_PROTOCOL))


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    return atomic_write_bytes(path, json.dumps(data).encode())


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())
