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
from typing import Any

import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate.parallel.pipeline_plan import SCHEDULES, PipelinePlan


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
        try:
            with torch.enable_grad(), context():
                y = module(*x)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            shapes = ", ".join(str(tuple(t.shape)) for t in x if isinstance(t, torch.Tensor))
            raise ConfigError(
                "pipeline.split",
                f"stage {stage} of {stages} failed on its micro-batch input ({shapes}): "
                f"{_first_line(err)}; `split(model, stage, stages)` "
                "must give the module that takes the previous stage's output",
            ) from None
        ys = tuple(y) if isinstance(y, (tuple, list)) else (y,)
        given = tuple(_like(t, stage > 0 and t.is_floating_point()) for t in x)
        outs = tuple(_like(t, t.requires_grad) for t in ys)
        out.append((given, outs))
        x = tuple(_like(t, t.is_floating_point()) for t in outs)
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].rstrip(".") if text else type(err).__name__


def _like(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return torch.empty_like(t).requires_grad_(requires_grad)


def new_schedule(
    plan: PipelinePlan,
    modules: Sequence[nn.Module],
    stage_ids: Sequence[int],
    stages: int,
    io: Sequence[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]],
    device: str,
    around_backward: Callable[[list[torch.Tensor]], contextlib.AbstractContextManager[Any]] | None = None,
) -> Any:
    """torch's schedule over this rank's stages, their metadata static (see the module's note);
    ``around_backward(outputs)`` is entered around each stage backward, given the outputs it starts
    from (the estimate's gradient-merge hooks)."""
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
    if around_backward is not None:
        for stage in built:
            _wrap_backward(stage, around_backward)
    return schedule


def _wrap_backward(
    stage: Any, around: Callable[[list[torch.Tensor]], contextlib.AbstractContextManager[Any]]
) -> None:
    """``stage.backward_maybe_with_nosync`` (torch's one entry of a stage's backward) inside ``around``."""
    from torch.utils._pytree import tree_leaves

    inner = stage.backward_maybe_with_nosync

    def backward(backward_type: Any, bwd_kwargs: dict[str, Any], last_backward: bool = False) -> Any:
        outputs = [t for t in tree_leaves(bwd_kwargs.get("stage_output")) if isinstance(t, torch.Tensor)]
        with around(outputs):
            return inner(backward_type, bwd_kwargs, last_backward)

    stage.backward_maybe_with_nosync = backward


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
