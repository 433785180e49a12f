"""Per-step time breakdown of one trace, and computation / communication per rank.

Each ``ProfilerStep#N`` span's wall time is split into kernel, memcpy, memset, runtime,
data loading, host compute and other, counted in that order of priority: time already
counted under an earlier category is not counted again, so the parts add up to the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.analysis.traces.events import LIGHTNING_ACTION_PREFIX

#: Categories of the step breakdown, in priority order.
STEP_PARTS = ("kernel", "memcpy", "memset", "runtime", "data loading", "host compute", "other")
#: Annotation names of data loading: torch's DataLoader iterator and Lightning's fetch.
#: (Lightning's name: checked against ``memprofiler.lightning._compat`` by ``tests/lightning/test_compat.py``.)
DATA_LOADING = (
    "enumerate(DataLoader)",
    LIGHTNING_ACTION_PREFIX + "[_TrainingEpochLoop].train_dataloader_next",
)
#: Host operators of a collective (gloo/NCCL process groups, c10d functional collectives).
COMM_OPS = ("c10d::", "gloo:", "nccl:", "record_param_comms", "_c10d_functional::")


@dataclass
class StepRow:
    """One profiler step: its wall time (µs) split into :data:`STEP_PARTS`."""

    step: str
    total_us: float
    parts: dict[str, float]


@dataclass
class RankRow:
    """Computation, communication and their overlap on one rank (µs), over its profiled steps."""

    rank: int
    source: str
    """``device`` (kernels) or ``host`` (operators, for CPU-only runs)."""
    step_us: float
    computation_us: float
    """Computation not overlapped by communication."""
    communication_us: float
    """Communication not overlapped by computation."""
    overlap_us: float
    other_us: float
