"""Write the measured tests' figures as a run directory ``memprofiler report`` / ``diff`` read.

One test body is one call: snapshot keys are ``0.{test node id}.{n}.{start|end}``, all in
``rank_0_memory_stats.yaml`` whichever ``pytest-xdist`` worker ran the test, so the runs of
two commits are diffed key by key. The directory is claimed like any run's
(``output.run_dir``): a second session into it writes ``version_{n}``. Torch-free.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.output.run_dir import RunManifest, claim, write_manifest
from memprofiler.output.writers import write_yaml


def now() -> str:
    """UTC time in ISO 8601, as the manifest records it."""
    return RunManifest.new(Path("."), 1).started


def write_run(root: str | os.PathLike[str], snapshots: Mapping[str, Any], started: str, status: str) -> Path:
    """Write the stats YAML and the run manifest; return the run directory.

    Args:
        root: ``--memprofiler-dir``; a ``version_{n}`` under it when it already holds a run.
        snapshots: snapshot key -> metrics.
        started: when the session started (:func:`now`).
        status: ``finished``, or ``crashed`` when the session was interrupted.
    """
    requested = Path(root).expanduser()
    manifest = dataclasses.replace(RunManifest.new(requested, 1), started=started)
    run_dir = claim(requested, manifest)
    write_yaml(run_dir / layout.MEMORY_STATS_YAML.format(rank=0), dict(snapshots))
    manifest.finish(status, [])
    write_manifest(run_dir, manifest)
    return run_dir
