"""Estimate a training step's per-rank peak memory before running it (fake tensors, no GPU)."""

from __future__ import annotations

from memprofiler.estimate.api import estimate_memory, estimate_plan, largest_batch
from memprofiler.estimate.batch_search import BatchSearch
from memprofiler.estimate.engine import as_loss, default_loss
from memprofiler.estimate.parallel.pipeline_plan import PipelinePlan
from memprofiler.estimate.plan import EstimatePlan
from memprofiler.estimate.result import MemoryEstimate

__all__ = [
    "BatchSearch",
    "EstimatePlan",
    "MemoryEstimate",
    "PipelinePlan",
    "as_loss",
    "default_loss",
    "estimate_memory",
    "estimate_plan",
    "largest_batch",
]
