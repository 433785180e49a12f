"""The role map beside an OOM record's pickle (``oom_rank_{r}_{n}.json``), read without failing.

The OOM flight recorder writes it with the record, in the window index's format
(:func:`~memprofiler.analysis.snapshot.calls.read_index` reads both). A record is read for what
its pickle holds: a role map that is missing (a record written before memprofiler wrote one),
unreadable or another recording's costs the names of its blocks, never the record, and is one
line saying so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.analysis.runs.artifacts import name_pattern
from memprofiler.analysis.snapshot.calls import index_mismatch, read_index
from memprofiler.errors import ArtifactError

_SHOWN_BY_STACK = "the blocks alive at the OOM are shown by stack only"


def is_oom_pickle(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is named as an OOM record's pickle (``oom_rank_{r}_{n}.pickle``)."""
    return name_pattern(layout.OOM_PICKLE).match(Path(path).name) is not None


def oom_role_index(
    pickle_path: str | os.PathLike[str], data: Mapping[str, Any], run_id: str | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """The role map beside the OOM pickle ``pickle_path`` (whose snapshot is ``data``), or
    ``None`` and one line saying why the blocks go unnamed."""
    p = Path(pickle_path)
    name = p.with_name(p.name[: -len(".pickle")] + ".json").name
    try:
        index = read_index(p, "role map")
    except ArtifactError as err:
        return None, f"{err}; {_SHOWN_BY_STACK}"
    if index is None:
        return None, f"{name}: no role map beside this OOM record; {_SHOWN_BY_STACK}"
    why = index_mismatch(index, data, run_id)
    if why is not None:
        return None, f"{name}: not the role map of the record beside it ({why}); {_SHOWN_BY_STACK}"
    return index, None
