"""Write torch's memory-by-category timeline of one profiler cycle beside its trace.

torch's memory profiler (``torch.profiler._memory_profiler``) classifies every tensor the
profiler saw as a parameter, optimizer state, input, activation, gradient, temporary or
autograd detail; it needs ``record_shapes``, ``profile_memory`` and ``with_stack``. Its
own ``export_memory_timeline`` is deprecated and draws a picture with matplotlib; this writes
the classified events as plain JSON (:data:`memprofiler.layout.PROFILER_MEMORY_CATEGORIES_JSON`),
which ``memprofiler report`` draws offline. Format (version 1)::

    {"format": "memprofiler-memory-categories", "version": 1, "time_unit": "us",
     "categories": ["parameter", ..., "unknown"],
     "devices": {"cpu": [[t_us, delta_bytes, tensor_id, version, category_index], ...]},
     "tensors": {"tensor_id": [operator, module, shape, dtype], ...}}

``delta_bytes`` is positive when a tensor version becomes live and negative when it ends;
``t_us`` is -1 for a tensor that existed before the cycle. Times are on the trace's clock.
``tensors`` (optional) says what made each tensor: the operator that allocated it (a factory
such as ``aten::empty`` named with its caller, ``aten::linear (aten::empty)``), the innermost
module open then (torch's ``nn.Module:`` span or Lightning's ``[pl][module]``, as the views name it), and its shape and dtype as an operator saw it as an
input; ``""`` / ``null`` where the profiler did not see it (a tensor from before the cycle).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from memprofiler import layout
from memprofiler.analysis.traces.events import MODULE_PREFIXES
from memprofiler.analysis.traces.ops import FACTORIES, module_name

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
        doc = category_events(prof)
        if "tensors_error" in doc:
            warn(
                "ExtendedPyTorchProfiler wrote its memory categories without the operator, module and "
                f"shape of each tensor: {doc['tensors_error']}",
                all_ranks=True,
            )
        return [write(json.dumps(doc).encode())]
    except Exception as err:  # torch's classifier is private API: a fault must not reach training
        warn(f"ExtendedPyTorchProfiler could not write its memory categories: {err!r}", all_ranks=True)
        return []


def category_events(prof: Any) -> dict[str, Any]:
    """The JSON document for ``prof`` (a finished ``torch.profiler.profile`` cycle)."""
    from torch.profiler import _memory_profiler as mp

    profile = prof._memory_profile()
    timeline = mp.MemoryProfileTimeline(profile)
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
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "time_unit": "us",
        "torch": torch.__version__,
        "categories": names,
        "devices": devices,
    }
    try:  # private API again: without it the categories still stand
        doc["tensors"] = tensor_origins(profile, {row[2] for rows in devices.values() for row in rows})
    except Exception as err:
        doc["tensors_error"] = repr(err)
    return doc


def tensor_origins(profile: Any, ids: set[int]) -> dict[str, list[Any]]:
    """``tensor id -> [operator, module, shape, dtype]`` for the tensors ``ids`` from torch's
    memory profile (its tree of profiler events): the allocation's enclosing operators and
    module, and the sizes an operator saw it with as an input."""
    from torch._C._profiler import _EventType, _TensorMetadata
    from torch.profiler import _memory_profiler as mp

    out: dict[str, list[Any]] = {}
    shapes: dict[int, tuple[list[int], str]] = {}
    for node in profile._op_tree.sorted_nodes:
        kind, fields = node.typed
        if kind == _EventType.Allocation:
            if fields.alloc_size <= 0:
                continue
            key = mp.TensorKey.from_allocation(fields)
            if key is None or key.id not in ids or str(key.id) in out:
                continue
            ops: list[str] = []
            module = ""
            parent = node.parent
            while parent is not None:
                if parent.typed[0] == _EventType.TorchOp and (not ops or ops[-1] in FACTORIES):
                    ops.append(parent.name)
                elif not module and parent.name.startswith(MODULE_PREFIXES):  # torch's or Lightning's span
                    module = module_name(parent.name)
                parent = parent.parent
            op = "" if not ops else ops[0] if len(ops) == 1 else f"{ops[-1]} ({ops[0]})"
            out[str(key.id)] = [op, module, None, None]
        elif kind == _EventType.TorchOp:
            for t in fields.inputs:
                if isinstance(t, _TensorMetadata):
                    k = mp.TensorKey.from_tensor(t)
                    if k is not None and k.id in ids and k.id not in shapes:
                        shapes[k.id] = (list(t.sizes), str(t.dtype).removeprefix("torch."))
    for tid, (sizes, dtype) in shapes.items():
        row = out.setdefault(str(tid), ["", "", None, None])
        row[2], row[3] = sizes, dtype
    return out
