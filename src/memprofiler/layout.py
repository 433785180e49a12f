"""On-disk names of everything memprofiler writes. One place, so readers and writers agree."""

from __future__ import annotations

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


#: Per-rank Chrome trace of memory counters and ``{fn}.{call}`` spans.
MEMORY_TRACE_JSON = "memory_trace_rank_{rank}.json"
#: ExtendedPyTorchProfiler trace, one per schedule cycle. ``{worker}.{span}.pt.trace.json`` is
#: the name TensorBoard's torch-tb-profiler plugin discovers; the worker is stage and rank.
PROFILER_TRACE_JSON = "{stage}_rank_{rank}.{cycle}.pt.trace.json"
#: ExtendedPyTorchProfiler per-rank summary table.
PROFILER_SUMMARY_TXT = "{stage}_rank_{rank}_summary.txt"
