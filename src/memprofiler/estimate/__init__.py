"""Estimate a training step's per-rank peak memory before running it (fake tensors, no GPU)."""

from __future__ import annotations

from memprofiler.estimate.api import estimate_memory
from memprofiler.estimate.result import MemoryEstimate

__all__ = ["MemoryEstimate", "estimate_memory"]
