"""A ``pytest-xdist`` worker's figures on disk as they are measured, so a worker that dies
(a test that kills its process, the OOM killer) does not take them with it.

The controller names a spool directory in each worker's ``workerinput``; the worker appends
one JSON line when a measured body starts and one with its snapshots when it ends. A worker
that finishes hands its figures over as usual (``workeroutput``) and the spool is only read
for one that went down without. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ``workerinput`` key: the spool directory the controller made.
WORKER_INPUT_KEY = "memprofiler_spool"


def spool_file(directory: str | Path, worker_id: str) -> Path:
    return Path(directory) / f"{worker_id}.jsonl"


def append(path: Path, record: dict[str, Any]) -> None:
    """One line, written and flushed before the test goes on (what a killed process leaves)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


@dataclass
class Recovered:
    """What a dead worker's spool held."""

    snapshots: dict[str, Any] = field(default_factory=dict)
    tests: int = 0
    """Measured tests whose figures were recovered."""
    unfinished: str | None = None
    """The test being measured when the worker died: no figures for it."""


def recover(path: Path) -> Recovered:
    """Read a spool; a last line cut by the kill is ignored."""
    out = Recovered()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # cut mid-line when the process died
        if not isinstance(record, dict):
            continue
        if "running" in record:
            out.unfinished = str(record["running"])
        elif isinstance(record.get("snapshots"), dict):
            out.snapshots.update(record["snapshots"])
            out.tests += 1
            out.unfinished = None
    return out
