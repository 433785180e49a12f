"""Write torch's memory-by-category timeline of one profiler cycle beside its trace.

torch's memory profiler (``torch.profiler._memory_profiler``) classifies every tensor the
profiler saw as a parameter, optimizer state, input, activation, gradient, temporary or
autograd detail; it needs ``record_shapes``, ``profile_memory`` and ``with_stack``. Its
own ``export_memory_timeline`` is deprecated and draws a picture with matplotlib; this writes
the classified events as plain JSON (:data:`memprofiler.layout.PROFILER_MEMORY_CATEGORIES_JSON`),
which ``memprofiler report`` draws offline. Format (version 1)::

    {"format": "memprofiler-memory-categories", "version": 1, "time_unit": "us",
     "categories": ["parameter", ..., "unknown"],
     "devices": {"cpu": [[t_us, delta_bytes, tensor_id, version, category_index], ...]}}

``delta_bytes`` is positive when a tensor version becomes live and negative when it ends;
``t_us`` is -1 for a tensor that existed before the cycle. Times are on the trace's clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from memprofiler import layout

#: The file's ``format`` and ``version``.
FORMAT, VERSION = layout.MEMORY_CATEGORIES_FORMAT, 1
_NEEDS = ("record_shapes", "profile_memory", "with_stack")
#: The companion-file kind of a trace cycle (:meth:`memprofiler.output.trace_files.TraceFiles.path_for`).
CATEGORIES = "memory_categories"


def write_category_timeline(
    prof: Any, write: Callable[[bytes], Path], warn: Callable[..., None]
) -> list[Path]:
    """Hand ``prof``'s memory-by-category document to ``write`` (which names and stores it);
    ``[path]``, or ``[]`` when the profiler lacks an option it needs or anything fails (a
    warning, never an exception)."""
    if not all(getattr(prof, name, False) for name in _NEEDS):
        return []
    try:
        return [write(json.dumps(category_events(prof)).encode())]
    except Exception as err:  # torch's classifier is private API: a fault must not reach training
        warn(f"ExtendedPyTorchProfiler could not write its memory categories: {err!r}", all_ranks=True)
        return []


def category_events(prof: Any) -> dict[str, Any]:
    """The JSON document for ``prof`` (a finished ``torch.profiler.profile`` cycle)."""
    from torch.profiler import _memory_profiler as mp

    timeline = mp.MemoryProfileTimeline(prof._memory_profile())
    order: list[Any] = [*mp.Category, None]
    names = [c.name.lower() if c is not None else "unknown" for c in order]
    index = {c: i for i, c in enumerate(order)}
    devices: dict[str, list[list[int]]] = {}

    def add(t: int, delta: int, key: Any, version: int) -> None:
        category = timeline.categories.get(key, version) if isinstance(key, mp.TensorKey) else None
        us = -1 if t < 0 else t // 1000
        devices.setdefault(str(key.device), []).append(
            [us, delta, int(getattr(key, "id", -1)), version, index.get(category, len(order) - 1)]
        )

    for t, action, (key, version), nbytes in timeline.timeline:
        if action in (mp.Action.PREEXISTING, mp.Action.CREATE):
            add(t, nbytes, key, version)
        elif action == mp.Action.INCREMENT_VERSION:
            add(t, -nbytes, key, version)
            add(t, nbytes, key, version + 1)
        elif action == mp.Action.DESTROY:
            add(t, -nbytes, key, version)
    return {
        "format": FORMAT,
        "version": VERSION,
        "time_unit": "us",
        "torch": torch.__version__,
        "categories": names,
        "devices": devices,
    }
