"""A pipeline plan: how the model is cut into stages and scheduled, the batch it takes, and how
its ranks' estimates make one result (:mod:`memprofiler.estimate.parallel.pipeline` runs a rank)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate.result import MemoryEstimate

#: ``split(model, stage, stages)``: the module of pipeline stage ``stage`` (0-based) of
#: ``stages``, cut from ``model`` (a meta copy of its own, which it may trim in place).
SplitFn = Callable[[nn.Module, int, int], nn.Module]
#: ``loss_fn(output, target)``: the loss of one micro-batch on the last stage, as torch's schedules take it.
StageLossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: The schedules modelled, by the name torch's ``get_schedule_class`` takes, to whether a rank
#: holds several stages (torch's ``PipelineScheduleMulti`` family).
SCHEDULES = {"GPipe": False, "1F1B": False, "Interleaved1F1B": True}


@dataclass(frozen=True)
class PipelinePlan:
    """How the model is cut into pipeline stages and scheduled (``EstimatePlan(pipeline=...)``).

    The plan's ``world_size`` is the number of pipeline ranks; rank ``r`` holds stages
    ``r, r + world_size, ...`` (``stages_per_rank`` of them), as torch's interleaved schedules
    place them.

    Example:
        >>> import torch
        >>> plan = PipelinePlan(split=lambda m, s, n: m, microbatches=4,
        ...                     loss_fn=torch.nn.functional.mse_loss, schedule="1f1b")
        >>> plan.schedule, plan.per_rank, plan.stages_of(1, ranks=2)
        ('1F1B', 1, [1])
    """

    split: SplitFn
    """``split(model, stage, stages) -> nn.Module``: the stage's module, cut from a copy of the
    model (trimmed in place, as a training script cuts its own), e.g. deleting the other stages'
    blocks from an ``nn.ModuleDict`` so names stay those of the whole model."""
    microbatches: int
    """Micro-batches per step (torch's ``n_microbatches``); the batch's first dimension splits
    into that many equal parts."""
    loss_fn: StageLossFn
    """``loss_fn(output, target)`` of one micro-batch, on the last stage (torch's ``loss_fn``)."""
    schedule: str = "1F1B"
    """``GPipe``, ``1F1B`` or ``Interleaved1F1B`` (torch's names, any case)."""
    stages_per_rank: int | None = None
    """Stages each rank holds; None: 1, or 2 for ``Interleaved1F1B``."""
    return_outputs: bool = True
    """``schedule.step(return_outputs=...)``: the last stage keeps every micro-batch's output and
    concatenates them (torch's default); False keeps none."""

    def __post_init__(self) -> None:
        names = {name.lower(): name for name in SCHEDULES}
        name = names.get(str(self.schedule).lower())
        if name is None:
            raise ConfigError(
                "pipeline.schedule", f"got {self.schedule!r}; use one of {', '.join(SCHEDULES)}"
            )
        object.__setattr__(self, "schedule", name)
        if not callable(self.split):
            raise ConfigError("pipeline.split", "pass `split(model, stage, stages) -> nn.Module`")
        if not callable(self.loss_fn):
            raise ConfigError("pipeline.loss_fn", "pass `loss_fn(output, target) -> loss`")
        _positive("pipeline.microbatches", self.microbatches)
        if self.stages_per_rank is not None:
            _positive("pipeline.stages_per_rank", self.stages_per_rank)
            if self.stages_per_rank > 1 and not SCHEDULES[name]:
                raise ConfigError(
                    "pipeline.stages_per_rank",
                    f"got {self.stages_per_rank} with {name}, which runs one stage per rank; use "
                    "Interleaved1F1B",
                )

    @property
    def per_rank(self) -> int:
        """Stages on each rank."""
        if self.stages_per_rank is not None:
            return self.stages_per_rank
        return 2 if SCHEDULES[self.schedule] else 1

    def stages_of(self, rank: int, ranks: int) -> list[int]:
        """The stages rank ``rank`` of ``ranks`` holds (torch's loop placement)."""
        return [rank + k * ranks for k in range(self.per_rank)]

    def describe(self, ranks: int) -> str:
        """``1F1B, 2 stages on 2 ranks, 4 micro-batches``."""
        stages = ranks * self.per_rank
        return f"{self.schedule}, {stages} stages on {ranks} ranks, {self.microbatches} micro-batches"


def _positive(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(key, f"got {value!r}; use an integer >= 1")


def check_batch(batch: Any, microbatches: int) -> tuple[tuple[Any, ...], torch.Tensor]:
    """The first stage's inputs and the last stage's target from a pipeline's batch
    ``(inputs, target)``; one line naming ``batch`` otherwise."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor)):
        raise ConfigError(
            "batch",
            "with a pipeline the batch is `(inputs, target)`: the first stage's input (a tensor or a "
            "tuple of them) and the last stage's loss target",
        )
    inputs = tuple(batch[0]) if isinstance(batch[0], (tuple, list)) else (batch[0],)
    target = batch[1]
    for t in (*inputs, target):
        if isinstance(t, torch.Tensor) and (t.dim() == 0 or t.shape[0] % microbatches):
            raise ConfigError(
                "pipeline.microbatches",
                f"the batch's tensor of shape {tuple(t.shape)} does not split into {microbatches} equal "
                "micro-batches along its first dimension",
            )
    return inputs, target


def worst_rank(per_rank: Sequence[MemoryEstimate], plan: PipelinePlan) -> MemoryEstimate:
    """The estimate of the rank whose peak is highest (the lower rank on a tie), with every rank's
    peak in ``stages`` and the pipeline named."""
    ranks = len(per_rank)
    worst = max(range(ranks), key=lambda r: (per_rank[r].peak_bytes, -r))
    out = per_rank[worst]
    out.stages = [est.stage_peak(r, plan.stages_of(r, ranks)) for r, est in enumerate(per_rank)]
    out.pipeline = plan.describe(ranks)
    held = ", ".join(str(s) for s in plan.stages_of(worst, ranks))
    out.notes.append(
        f"pipeline ({out.pipeline}): the figures are rank {worst}'s (stage {held}), the highest peak; "
        "`stages` gives every rank's"
    )
    return out
