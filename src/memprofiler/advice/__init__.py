"""Make it fit: the changes that bring a training step under a memory budget, each one estimated."""

from __future__ import annotations

from memprofiler.advice.api import advise
from memprofiler.advice.plan import Plan
from memprofiler.advice.result import Advice, Row

__all__ = ["Advice", "Plan", "Row", "advise"]
