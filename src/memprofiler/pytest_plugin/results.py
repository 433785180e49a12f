"""Write the measured tests' figures as a run directory ``memprofiler report`` / ``diff`` read.

One test body is one call: snapshot keys are ``0.{test node id}.{n}.{start|end}``, all in
``rank_0_memory_stats.yaml`` whichever ``pytest-xdist`` worker ran the test, so the runs of
two commits are diffed key by key. Torch-free.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from memprofiler import __version__, layout
from memprofiler.output.writers import to_plain, write_text


def now() -> str:
    """UTC time in ISO 8601, as the manifest records it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def free_run_dir(root: Path) -> Path:
    """``root``, or its first free ``version_{n}`` when ``root`` already holds a run."""

    def taken(d: Path) -> bool:
        return (d / layout.RUN_MANIFEST).exists() or (d / layout.MEMORY_STATS_YAML.format(rank=0)).exists()

    if not taken(root):
        return root
    n = 1
    while taken(root / layout.RUN_VERSION_DIR.format(n=n)):
        n += 1
    return root / layout.RUN_VERSION_DIR.format(n=n)


def _yaml_file(data: Mapping[str, Any]) -> str:
    body = yaml.safe_dump(to_plain(data), sort_keys=False, default_flow_style=False) if data else ""
    return f"{layout.YAML_HEADER}\n{body}{layout.YAML_BLOCK_END.format(n=len(data))}\n"


def write_run(root: str | os.PathLike[str], snapshots: Mapping[str, Any], started: str, status: str) -> Path:
    """Write the stats YAML and the run manifest; return the run directory.

    Args:
        root: ``--memprofiler-dir``; a ``version_{n}`` under it when it already holds a run.
        snapshots: snapshot key -> metrics.
        started: when the session started (:func:`now`).
        status: ``finished``, or ``crashed`` when the session was interrupted.
    """
    run_dir = free_run_dir(Path(root).expanduser())
    write_text(run_dir / layout.MEMORY_STATS_YAML.format(rank=0), _yaml_file(snapshots))
    manifest = {
        "run_id": uuid.uuid4().hex,
        "started": started,
        "finished": now(),
        "status": status,
        "world_size": 1,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "memprofiler": __version__,
    }
    write_text(run_dir / layout.RUN_MANIFEST, _yaml_file(manifest))
    return run_dir
