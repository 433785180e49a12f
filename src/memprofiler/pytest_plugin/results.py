"""Write the measured tests' figures as a run directory ``memprofiler report`` / ``diff`` read.

One test body is one call: snapshot keys are ``0.{test node id}.{n}.{start|end}``, all in
``rank_0_memory_stats.yaml`` whichever ``pytest-xdist`` worker ran the test, so the runs of
two commits are diffed key by key. The directory is claimed like any run's
(``output.run_dir``): a second session into it writes ``version_{n}``; a URL (``s3://...``)
is claimed on the store. Torch-free.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.config import urls
from memprofiler.errors import ArtifactError, ConfigError
from memprofiler.output import remote
from memprofiler.output.remote import RemoteDir, is_url
from memprofiler.output.run_dir import RunManifest, claim, write_manifest
from memprofiler.output.writers import write_yaml, yaml_document

#: The option a message names (the user set it, not ``save_dir``).
OPTION = "--memprofiler-dir"


def now() -> str:
    """UTC time in ISO 8601, as the manifest records it."""
    return RunManifest.new(Path("."), 1).started


def check_out_dir(value: str) -> None:
    """Before any test runs: ``value`` can hold the figures (nothing is created).

    Raises:
        ConfigError: an almost-right URL, or a store that ends with the session (``memory://``).
        ArtifactError: a file where the directory would go, a directory we may not write, a
            store that refuses us; one line naming ``--memprofiler-dir`` and the fix.
    """
    urls.check_dir(value, OPTION)
    if urls.in_process(value):
        raise ConfigError(OPTION, urls.in_process_message(value, "when this pytest session ends"))
    if is_url(value):
        remote.check_writable(RemoteDir.from_url(value, key=OPTION), key=OPTION)
        return
    path = Path(value).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ArtifactError(
            f"`{OPTION}` {value!r}: {str(existing)!r} is a file, not a directory; "
            f"give `{OPTION}` a directory (it is created if missing)"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArtifactError(
            f"`{OPTION}` {value!r} is not writable (no write permission on {str(existing)!r}); "
            f"give `{OPTION}` a writable directory"
        )


def write_run(root: str | os.PathLike[str], snapshots: Mapping[str, Any], started: str, status: str) -> str:
    """Write the stats YAML and the run manifest; return the run directory (a URL for a store).

    Args:
        root: ``--memprofiler-dir``; a ``version_{n}`` under it when it already holds a run.
        snapshots: snapshot key -> metrics.
        started: when the session started (:func:`now`).
        status: ``finished``, or ``crashed`` when the session was interrupted.

    Raises:
        ArtifactError: the directory cannot be written (one line naming ``--memprofiler-dir``).
    """
    if is_url(root):
        return _write_remote(RemoteDir.from_url(os.fspath(root), key=OPTION), snapshots, started, status)
    requested = Path(root).expanduser()
    manifest = dataclasses.replace(RunManifest.new(requested, 1), started=started)
    run_dir = claim(requested, manifest, key=OPTION)
    write_yaml(run_dir / layout.MEMORY_STATS_YAML.format(rank=0), dict(snapshots))
    manifest.finish(status, [])
    write_manifest(run_dir, manifest)
    return str(run_dir)


def _write_remote(requested: RemoteDir, snapshots: Mapping[str, Any], started: str, status: str) -> str:
    manifest = dataclasses.replace(RunManifest.new(Path(), 1), started=started, save_dir=requested.url)
    run = remote.claim(requested, yaml_document(manifest.to_dict()).encode())
    run.put(layout.MEMORY_STATS_YAML.format(rank=0), yaml_document(dict(snapshots)).encode())
    manifest.finish(status, [])
    run.put(layout.RUN_MANIFEST, yaml_document(manifest.to_dict()).encode())
    return run.url
