"""Estimate a training step's per-rank peak memory before running it (fake tensors, no GPU)."""

from __future__ import annotations

from memprofiler.estimate.api import estimate_memory, estimate_plan
from memprofiler.estimate.plan import EstimatePlan
from memprofiler.estimate.result import MemoryEstimate

__all__ = ["EstimatePlan", "MemoryEstimate", "estimate_memory", "estimate_plan"]
