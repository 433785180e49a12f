"""``Probe``: where a tool watches an estimate's steps without patching the engine."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Probe:
    """Called by the engine as the steps run; every method does nothing here.

    A tool subclasses it and passes it to :func:`memprofiler.estimate.estimate_plan`
    (``tools/gpu_estimate_probe.py`` reads the prepared model, ``tools/gpu_probe/`` marks steps).
    """

    def steps_start(self, model: nn.Module, optimizer: torch.optim.Optimizer, tracker: Any) -> None:
        """Before the first step: the prepared (sharded, materialised) model, its optimizer, the tracker."""

    def step_start(self, step: int) -> None:
        """Before step ``step`` (1-based)."""

    def steps_end(self) -> None:
        """After the last step, still inside the estimate's modes."""
