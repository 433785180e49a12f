"""Where a run writes: ``save_dir`` resolved, checked and claimed once, in one place.

A run directory holds one run. A second run pointed at a directory that already holds one
(finished, crashed or still running) writes into the first free ``version_{n}`` under it, as
Lightning's loggers do, and says so: nothing a run wrote is ever overwritten by another. The
claim is atomic (``O_EXCL`` on the manifest), so two jobs starting together under one parent
never share a directory.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler._version import __version__
from memprofiler.errors import ArtifactError
from memprofiler.output.writers import FILE_MODE, write_yaml, yaml_document

#: Bytes the set-up check really writes (and removes): an empty probe fits on a full disk.
PROBE_BYTES = 64 * 1024
#: Below this much free space the set-up check warns: a long run's files would not fit.
LOW_SPACE_BYTES = 256 * 1024 * 1024

_PER_RANK = (
    layout.MEMORY_STATS_YAML,
    layout.MEMORY_STATS_PICKLE,
    layout.MEMORY_TRACE_JSON,
)


def _glob(pattern: str) -> str:
    return re.sub(r"\{[^}]*\}", "*", pattern)


def holds_run(path: Path, rank: int | None = None) -> bool:
    """Whether ``path`` itself (not its ``version_{n}`` subdirectories) holds a run's files.

    With ``rank``, only that rank's files count (ranks that cannot ask rank 0).
    """
    if rank is None and (path / layout.RUN_MANIFEST).exists():
        return True
    for pattern in _PER_RANK:
        if rank is not None:
            if (path / pattern.format(rank=rank)).exists():
                return True
        elif next(path.glob(_glob(pattern)), None) is not None:
            return True
    return False


def candidates(requested: Path) -> Iterator[Path]:
    yield requested
    n = 1
    while True:
        yield requested / layout.RUN_VERSION_DIR.format(n=n)
        n += 1


def check_writable(path: Path, key: str = "save_dir") -> None:
    """Create ``path`` if needed and prove a real file can be written in it.

    Raises:
        ArtifactError: naming the key, the directory and the fix.
    """
    probe = path / f".memprofiler-write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise ArtifactError(
            f"`{key}` {str(path)!r} is not writable ({err.strerror or err}); "
            f"choose a writable directory with `{key}: ...`"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


@dataclass
class RunManifest:
    """``memprofiler_run.yaml``: marks a directory as one run and says how it ended."""

    run_id: str
    started: str
    world_size: int
    host: str
    pid: int
    memprofiler: str
    save_dir: str
    """The directory asked for; the run may sit in a ``version_{n}`` under it."""
    finished: str | None = None
    status: str = "running"
    notes: list[str] = field(default_factory=list)
    """Why a run collected less than configured (never-called functions, unopened windows)."""
    error: str | None = None
    """What ended a crashed run: the exception's type and the first line of its message."""

    @classmethod
    def new(cls, requested: Path, world_size: int) -> RunManifest:
        return cls(
            run_id=uuid.uuid4().hex[:12],
            started=_now(),
            world_size=world_size,
            host=socket.gethostname(),
            pid=os.getpid(),
            memprofiler=__version__,
            save_dir=str(requested),
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def finish(self, status: str, notes: list[str]) -> None:
        self.finished = _now()
        self.status = status
        self.notes = list(notes)


def crash_line(exc: BaseException, limit: int = 300) -> str:
    """``RuntimeError: CUDA out of memory. Tried to allocate ...``: the type and the first line.

    Example:
        >>> crash_line(ValueError("bad batch\\nmore"))
        'ValueError: bad batch'
    """
    first = next(iter(str(exc).splitlines()), "").strip()
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def claim(requested: Path, manifest: RunManifest, key: str = "save_dir") -> Path:
    """Rank 0: the first of ``requested``, ``requested/version_1``, ... that holds no run, claimed
    by creating its manifest exclusively.

    Raises:
        ArtifactError: the directory cannot be created or written.
    """
    for path in candidates(requested):
        check_writable(path, key)
        if holds_run(path):
            continue
        try:
            fd = os.open(path / layout.RUN_MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:  # another job claimed it between the check and now
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(yaml_document(manifest.to_dict()))
        return path
    raise AssertionError("unreachable")


def follow(requested: Path, rank: int) -> Path:
    """A rank that cannot ask rank 0: the first candidate without this rank's own files."""
    for path in candidates(requested):
        check_writable(path)
        if not holds_run(path, rank=rank):
            return path
    raise AssertionError("unreachable")


def write_manifest(path: Path, manifest: RunManifest) -> Path:
    return write_yaml(path / layout.RUN_MANIFEST, manifest.to_dict())
