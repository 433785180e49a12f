"""Atomic writers for the plain files memprofiler produces (YAML, pickle, text, JSON).

Files get the permissions ``open()`` would give them (``0666`` less the umask, so ``0644``
under the usual ``022``), like Lightning's own files: ``mkstemp``'s ``0600`` would lock CI
artifact collectors and colleagues on a shared disk out of them.
"""

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

from memprofiler import layout

#: memory_viz rejects pickle protocol 5 ("Unhandled version 5"), the newer Pythons' default.
PICKLE_PROTOCOL = 4


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, once, at import
    os.umask(mask)
    return mask


#: Mode of every file written: what ``open()`` would create.
FILE_MODE = 0o666 & ~_umask()

#: The system calls every writer here goes through: a seam for tests that fill the disk
#: (``OSError(ENOSPC)`` after N bytes) without a small filesystem.
_write = os.write
_pwrite = os.pwrite


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = _pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``.

    A reader never sees a half-written file, and a crash mid-write leaves the old file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, FILE_MODE)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
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


def block_end(entries: int) -> str:
    """The line closing a block of top-level YAML entries (see ``layout.YAML_BLOCK_END``)."""
    return layout.YAML_BLOCK_END.format(n=entries) + "\n"


def yaml_document(data: Any) -> str:
    """``data`` as YAML between the integrity lines: a reader can tell a cut copy from a whole one."""
    plain = to_plain(data)
    body = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)
    entries = len(plain) if isinstance(plain, dict) else 1
    return f"{layout.YAML_HEADER}\n{body}{block_end(entries)}"


def write_yaml(path: str | os.PathLike[str], data: Any) -> Path:
    return atomic_write_bytes(path, yaml_document(data).encode())


def append_bytes(path: str | os.PathLike[str], data: bytes, fsync: bool = False) -> Path:
    """Append ``data`` in one ``write``; the file must exist (start it with :func:`atomic_write_bytes`).

    No fsync by default: what a killed process wrote is in the page cache and reaches the disk
    anyway; fsync only guards against the machine itself going down. A write that fails part
    way (a full disk) is cut back off: the file ends where it ended before, at a whole record.
    """
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
            if fsync:
                os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)  # shrinking needs no free space
            raise
    finally:
        os.close(fd)
    return path


def rewrite_tail(path: str | os.PathLike[str], offset: int, data: bytes, fsync: bool = False) -> Path:
    """Replace everything from byte ``offset`` on with ``data`` (a JSON file's closing part).

    A write that fails part way (a full disk) puts the old closing part back: the file stays
    the whole document it was (the old part fitted before, in blocks the file still holds).
    """
    path = Path(path)
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, max(0, os.fstat(fd).st_size - offset), offset)
        try:
            _pwrite_all(fd, data, offset)
            os.ftruncate(fd, offset + len(data))
            if fsync:
                os.fsync(fd)
        except BaseException:
            _pwrite_all(fd, old, offset)  # over blocks the file holds: needs no free space
            os.ftruncate(fd, offset + len(old))
            raise
    finally:
        os.close(fd)
    return path


def write_pickle(path: str | os.PathLike[str], data: Any, plain: bool = True) -> Path:
    payload = to_plain(data) if plain else data
    return atomic_write_bytes(path, pickle.dumps(payload, protocol=PICKLE_PROTOCOL))


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    return atomic_write_bytes(path, json.dumps(data).encode())


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())
