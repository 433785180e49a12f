"""The run id each per-rank file carries, and the check that files read as one run come from one.

A stats YAML keeps it on its second line (``layout.RUN_ID_LINE``), a memory trace in
``otherData`` (``layout.TRACE_RUN_ID_KEY``), the manifest as ``run_id``, a profiler trace in
the ``memprofiler`` object that opens the file (``run_id``). Files written before the id
existed carry none and are taken as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.analysis.files.compressed import open_maybe_gzip
from memprofiler.errors import ArtifactError

#: The extended profiler's traces open with ``{"memprofiler": {"run_id": "...", ...``.
_PROFILER_RUN_ID = re.compile(rb'^\s*\{\s*"memprofiler"\s*:\s*\{\s*"run_id"\s*:\s*"([0-9A-Za-z_.-]{1,64})"')

_RUN_LINE = re.compile(re.escape(layout.RUN_ID_LINE).replace(re.escape("{run_id}"), r"(\S+)") + r"\r?$")


def stats_run_id(path: Path) -> str | None:
    """The run id under a stats YAML's header, or ``None`` (an older file, or none written)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512).decode("utf-8", "replace").split("\n")
    except OSError:
        return None
    if len(head) < 2 or head[0].rstrip("\r") != layout.YAML_HEADER:
        return None
    match = _RUN_LINE.match(head[1])
    return match.group(1) if match else None


def trace_run_id(trace: Mapping[str, Any]) -> str | None:
    """The run id in a memory trace's ``otherData``, or ``None``."""
    other = trace.get("otherData")
    value = other.get(layout.TRACE_RUN_ID_KEY) if isinstance(other, Mapping) else None
    return value if isinstance(value, str) and value else None


def profiler_trace_run_id(path: Path) -> str | None:
    """The run id at the head of an extended-profiler trace (gzip'd or not), or ``None``
    (a plain ``torch.profiler`` trace, an older one, or an unreadable file: its reader says so)."""
    try:
        with open_maybe_gzip(path) as f:
            head = f.read(4096)
    except (OSError, EOFError, ValueError):
        return None
    match = _PROFILER_RUN_ID.match(head)
    return match.group(1).decode() if match else None


def check_one_run(found: Iterable[tuple[str, str | None]]) -> None:
    """Refuse files of two runs read as one.

    Args:
        found: (file, its run id or ``None``) for every file read as one run.

    Raises:
        ArtifactError: two ids; one line naming a file of each and the fix.
    """
    first: dict[str, str] = {}
    for where, run_id in found:
        if run_id:
            first.setdefault(run_id, where)
    if len(first) > 1:
        (a_id, a), (b_id, b) = list(first.items())[:2]
        more = f" (and {len(first) - 2} more run(s))" if len(first) > 2 else ""
        raise ArtifactError(
            f"{a!r} is from run {a_id} but {b!r} from run {b_id}{more}: two runs' rank files would be "
            "merged as one; pass the directories of one run (or move the other run's files out)"
        )
