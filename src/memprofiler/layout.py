"""On-disk names of everything memprofiler writes. One place, so readers and writers agree."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: Snapshot key in the per-rank stats file: ``{rank}.{fn}.{call}.{start|end}``.
SNAPSHOT_KEY = "{rank}.{fn}.{call}.{phase}"
#: Consolidated per-rank snapshots.
MEMORY_STATS_YAML = "rank_{rank}_memory_stats.yaml"
MEMORY_STATS_PICKLE = "rank_{rank}_memory_stats.pickle"
#: Default output directory name under the trainer's log dir.
DEFAULT_SUBDIR = "memprofiler"


def snapshot_key(rank: int, fn: str, call: int, phase: str) -> str:
    return SNAPSHOT_KEY.format(rank=rank, fn=fn, call=call, phase=phase)


def parse_snapshot_key(key: str) -> tuple[int, str, int, str]:
    """Split ``"0.training_step.2.end"`` into ``(0, "training_step", 2, "end")``.

    Function names may contain dots (``model.encode``): only the first and last two parts
    are fixed.
    """
    rank, rest = key.split(".", 1)
    fn, call, phase = rest.rsplit(".", 2)
    return int(rank), fn, int(call), phase


#: Allocator-history pickle (memory_viz) at the start / end of a collected call; the
#: ancestor's name.
CUDA_ALLOC_PICKLE = "cuda_alloc_rank_{rank}.{fn}.{call}.{phase}.pickle"
#: One allocator-history recording per collected window (part ``n`` of the run, from 0): every
#: collected call of the window is marked inside it (see :data:`CALL_MARK`), so a call's view is
#: cut from this one file. memory_viz reads it as it is.
CUDA_ALLOC_WINDOW_PICKLE = "cuda_alloc_rank_{rank}.window_{n}.pickle"
#: Beside it: the calls it holds with their boundaries on memprofiler's clock, and the role map
#: (parameters, gradients, optimizer state, buffers) of the blocks alive when it began.
CUDA_ALLOC_WINDOW_INDEX = "cuda_alloc_rank_{rank}.window_{n}.json"
#: The ``format`` field of that file (its writer and its reader check the same tag).
CUDA_ALLOC_WINDOW_FORMAT = "memprofiler-allocator-window"
#: The entry fields :func:`recording_digest` reads.
_DIGEST_FIELDS = ("action", "addr", "size", "stream", "time_us")


def recording_digest(snapshot: Mapping[str, Any]) -> str:
    """What ties a window index to its recording: a SHA-256 of each device trace's length and
    its first and last entries (action, address, size, stream, time), written into the index
    with the recording and checked by its reader (a copied foreign index does not match)."""
    traces = snapshot.get("device_traces") or []
    ends: list[Any] = []
    for trace in traces if isinstance(traces, list) else []:
        if not isinstance(trace, list):
            ends.append(None)
            continue
        pick = [trace[0], trace[-1]] if trace else []
        ends.append(
            [
                len(trace),
                *([e.get(k) for k in _DIGEST_FIELDS] if isinstance(e, Mapping) else None for e in pick),
            ]
        )
    text = json.dumps(ends, default=repr, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


#: Name of the user-scope ``record_function`` that marks a collected call in the recording; the
#: allocator keeps its ``START`` and ``END`` in the snapshot's ``external_annotations``.
CALL_MARK = "memprofiler:{fn}:{call}"
CALL_MARK_PREFIX = "memprofiler:"
#: OOM flight records; ``n`` counts up from 0 so an earlier record is never overwritten.
OOM_PICKLE = "oom_rank_{rank}_{n}.pickle"
OOM_YAML = "oom_rank_{rank}_{n}.yaml"
#: Beside an OOM record's pickle: the role map (parameters, gradients, optimizer state, buffers)
#: of the blocks alive when it was written, in the window index's format (its reader is the same).
OOM_ROLES = "oom_rank_{rank}_{n}.json"


def cuda_alloc_pickle(rank: int, fn: str, call: int, phase: str) -> str:
    return CUDA_ALLOC_PICKLE.format(rank=rank, fn=fn, call=call, phase=phase)


def call_mark(fn: str, call: int) -> str:
    return CALL_MARK.format(fn=fn, call=call)


def parse_call_mark(name: str) -> tuple[str, int] | None:
    """``("training_step", 3)`` from ``"memprofiler:training_step:3"``; ``None`` for other names."""
    if not name.startswith(CALL_MARK_PREFIX):
        return None
    fn, _, call = name[len(CALL_MARK_PREFIX) :].rpartition(":")
    return (fn, int(call)) if fn and call.isdigit() else None


#: Module-wise tracker reports, one pair (``.log`` + ``.yaml``) per collected call.
FSDP_MEM_REPORT = "fsdp_mem_rank_{rank}_{fn}_{call}"
MODULE_MEM_REPORT = "module_mem_rank_{rank}_{fn}_{call}"
#: Cross-rank summary written by rank 0 after gathering every rank's snapshots.
MEMORY_SUMMARY_YAML = "memory_summary.yaml"
#: Per-rank Chrome trace of memory counters and ``{fn}.{call}`` spans.
MEMORY_TRACE_JSON = "memory_trace_rank_{rank}.json"
#: ExtendedPyTorchProfiler trace, one per schedule cycle. ``{worker}.{span}.pt.trace.json`` is
#: the name ``torch.profiler.tensorboard_trace_handler`` gives (worker = stage and rank), which
#: ``memprofiler report`` and Perfetto read.
PROFILER_TRACE_JSON = "{stage}_rank_{rank}.{cycle}.pt.trace.json"
#: Memory by category (parameter, optimizer state, input, activation, gradient, temporary,
#: autograd detail) over one profiler cycle, from torch's memory profiler; written beside that
#: cycle's trace when ``record_shapes``, ``profile_memory`` and ``with_stack`` are all on.
PROFILER_MEMORY_CATEGORIES_JSON = "{stage}_rank_{rank}.{cycle}.memory_categories.json"
#: The ``format`` field of that file (its writer and its reader check the same tag).
MEMORY_CATEGORIES_FORMAT = "memprofiler-memory-categories"
#: ExtendedPyTorchProfiler per-rank step timeline of the whole run: a span per Lightning hook
#: and data-loader wait, host-metric counters (``memprofiler merge-traces`` folds it in).
STEP_TIMELINE_JSON = "step_timeline_rank_{rank}.json"
#: ExtendedPyTorchProfiler per-rank summary table.
PROFILER_SUMMARY_TXT = "{stage}_rank_{rank}_summary.txt"

# ---------------------------------------------------------------------------- runs
#: Run manifest, written by rank 0 at set-up and rewritten at the end: ``run_id``, ``started``,
#: ``finished`` (null while running), ``status`` (``running`` / ``finished`` / ``crashed``),
#: ``world_size``, ``host``, ``pid``, ``memprofiler`` (version), ``notes``, and ``error`` (what
#: ended a crashed run). Marks a directory as one run.
RUN_MANIFEST = "memprofiler_run.yaml"
#: A second run into a ``save_dir`` that already holds a run (live or finished) writes into the
#: first free ``version_{n}`` under it, n >= 1, as Lightning's loggers do; nothing is overwritten.
RUN_VERSION_DIR = "version_{n}"

# ---------------------------------------------------------------------------- YAML integrity
#: First line of every YAML file memprofiler writes. A file that starts with it must end with a
#: block-end line; one that does not is cut (copied partially, or killed mid-append).
YAML_HEADER = "#memprofiler-yaml v1"
#: Second line of a per-rank stats YAML: the id of the run (the manifest's ``run_id``) that
#: wrote it, so ``report`` refuses to put two runs' ranks together. Files without it still read.
RUN_ID_LINE = "#memprofiler-run {run_id}"
#: Where a per-rank memory trace keeps the same id: ``otherData[TRACE_RUN_ID_KEY]``.
TRACE_RUN_ID_KEY = "memprofiler_run_id"
#: And the process group's world size when the rank had one (absent without): evidence that
#: tells two runs' files apart when a rank never learned the run id (``analysis.runs.evidence``).
TRACE_WORLD_SIZE_KEY = "memprofiler_world_size"
#: Written after every block of top-level entries: ``#memprofiler-end entries=<n>``, ``n`` the
#: number of top-level keys in the file up to this line. Files appended in blocks (the stats
#: YAML) hold one per block; the last line of an intact file is one. A reader keeps what lies
#: before the last block-end whose count matches, and reports anything after it as cut.
YAML_BLOCK_END = "#memprofiler-end entries={n}"

# ---------------------------------------------------------------------------- estimates
#: Written by ``MemProfilerCLI estimate`` into ``save_dir``: one rank's estimated peak and its
#: breakdown per batch size (``memprofiler report`` / ``diff`` read it beside a measured run).
MEMORY_ESTIMATE_YAML = "memory_estimate.yaml"
