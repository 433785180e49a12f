"""Pipeline parallelism: one rank's stages run by torch's own schedule on the fake process group.

Each pipeline rank is estimated apart, as the rank it is (the fake process group's rank): its
stage modules (the plan's ``split`` of a meta copy of the model) become
``torch.distributed.pipelining.PipelineStage`` objects and the schedule class torch names
(``GPipe``, ``1F1B``, ``Interleaved1F1B``) runs them, so the order of forwards and backwards, the
micro-batches in flight, the receive buffers a stage keeps for every micro-batch and the outputs
the last stage keeps are torch's own. Sends and receives on the fake process group move no data:
a received buffer is allocated as in a real run and left as it was.

A real process group's ``Work`` keeps the tensor it sends or receives until the ``Work`` object
itself is dropped, not only until ``wait()``: gloo's ``SendWork`` / ``RecvWork`` hold it as a member
(``ProcessGroupGloo.cpp``), NCCL's point-to-point ``Work`` stores it in ``work->outputs_``
(``ProcessGroupNCCL::pointToPoint``). torch's schedules keep their works in lists for a while (1F1B's
``send_work`` holds the first forward send through the steady phase; GPipe's ``bwd_sends_to_wait``
every input gradient until the last backward), so a sent activation or gradient outlives its use.
The fake process group's ``Work`` holds nothing; :func:`works_hold_tensors` gives every work the
schedule gets the tensors its operations carry, for as long as the schedule keeps it.

A stage gets its input and output shapes (torch's static metadata) from a forward of every
stage on the first micro-batch before the step, on fake tensors and uncounted, as a training
script states them; so the schedule infers nothing at start-up. Its warm-up vote (torch 2.13:
each rank votes for static metadata over point-to-point sends, then reads the result with
``.item()``) cannot be carried by the fake process group: every real rank given its shapes votes
static, so :func:`new_schedule` sets that result on its stages instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
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
        return f"{self.schedule}, {ranks * self.per_rank} stages on {ranks} ranks, {self.microbatches} micro-batches"


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


def rank_model(stage_modules: Sequence[nn.Module]) -> nn.Module:
    """The module a rank trains: its one stage, or its stages in an ``nn.ModuleList``."""
    return stage_modules[0] if len(stage_modules) == 1 else nn.ModuleList(stage_modules)


def stage_io(
    make_stage: Callable[[int], nn.Module],
    inputs: tuple[Any, ...],
    stages: int,
    microbatches: int,
    context: Callable[[], Any],
) -> list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    """Each stage's input and output of one micro-batch (fake tensors, never counted), by a
    forward of every stage in turn under ``context()`` (the step's autocast).

    An input a gradient reaches (every stage's but the first) requires grad, as torch's stage
    needs it to send that gradient back.
    """
    x: tuple[Any, ...] = tuple(
        torch.tensor_split(t, microbatches)[0] if isinstance(t, torch.Tensor) else t for t in inputs
    )
    out: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = []
    for stage in range(stages):
        module = make_stage(stage)
        with torch.enable_grad(), context():
            y = module(*x)
        ys = tuple(y) if isinstance(y, (tuple, list)) else (y,)
        given = tuple(_like(t, stage > 0 and t.is_floating_point()) for t in x)
        outs = tuple(_like(t, t.requires_grad) for t in ys)
        out.append((given, outs))
        x = tuple(_like(t, t.is_floating_point()) for t in outs)
    return out


def _like(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return torch.empty_like(t).requires_grad_(requires_grad)


def new_schedule(
    plan: PipelinePlan,
    modules: Sequence[nn.Module],
    stage_ids: Sequence[int],
    stages: int,
    io: Sequence[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]],
    device: str,
) -> Any:
    """torch's schedule over this rank's stages, their metadata static (see the module's note)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    built = [
        PipelineStage(m, s, stages, torch.device(device), input_args=io[s][0], output_args=io[s][1])
        for m, s in zip(modules, stage_ids, strict=True)
    ]
    cls = get_schedule_class(plan.schedule)
    try:
        schedule = cls(
            built if SCHEDULES[plan.schedule] else built[0], plan.microbatches, loss_fn=plan.loss_fn
        )
    except ValueError as err:  # torch's own rule on micro-batches per stage
        raise ConfigError("pipeline.microbatches", f"{plan.schedule} refuses the plan: {err}") from None
    _vote_static(schedule)
    return schedule


def _vote_static(schedule: Any) -> None:
    """What torch's warm-up vote decides when every stage was given its shapes: static metadata."""
    if not hasattr(schedule, "_warmup_p2p"):  # a torch without the vote: nothing to stand in for
        return
    from torch.distributed.pipelining._utils import InferenceMode

    def voted(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedule._warmup_p2p = voted


def step(
    schedule: Any, plan: PipelinePlan, first: bool, last: bool, inputs: tuple[Any, ...], target: Any
) -> None:
    """One ``schedule.step`` as the rank calls it: the inputs on the first stage's rank, the
    target (and a list for the losses) on the last's; the merged outputs are dropped."""
    kwargs: dict[str, Any] = {"return_outputs": plan.return_outputs}
    if last:
        kwargs.update(target=target, losses=[])
    with works_hold_tensors():
        schedule.step(*(inputs if first else ()), **kwargs)


class HeldWork:
    """A ``Work`` of the fake process group with the tensors a real one would keep (see the module's note)."""

    def __init__(self, work: Any, tensors: list[torch.Tensor]) -> None:
        self.work = work
        self.tensors = tensors

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


@contextlib.contextmanager
def works_hold_tensors() -> Iterator[None]:
    """While the block runs, every batch of point-to-point works torch's schedules start holds its
    tensors: one work per operation its own, else (a coalesced batch) every work all of them."""
    from torch.distributed.pipelining import schedules

    batch = schedules._batch_p2p

    def held(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
        works = batch(p2p_ops, desc=desc)
        tensors = [op.tensor for op in p2p_ops]
        if len(works) == len(p2p_ops):
            return [HeldWork(w, [t]) for w, t in zip(works, tensors, strict=True)]
        return [HeldWork(w, tensors) for w in works]

    schedules._batch_p2p = held
    try:
        yield
    finally:
        schedules._batch_p2p = batch


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
        "`stages` gives every rank's. Gradients merged inside a stage's backward are counted out of "
        "place (torch merges some in place)"
    )
    return out
