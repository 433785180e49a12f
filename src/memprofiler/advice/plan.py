"""The training step ``advise`` varies: a :class:`Plan`, and the one call that estimates it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memprofiler.advice import checkpointing
from memprofiler.advice.optimizers import OptimizerSpec
from memprofiler.estimate import EstimatePlan, MemoryEstimate, estimate_plan
from memprofiler.estimate.engine import meta_copy

LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class Plan:
    """One training step as the estimate runs it: the model, the batch, the optimizer, the strategy.

    A change never edits a plan: it returns a new one (:func:`dataclasses.replace`), and
    :func:`estimate` builds the model that plan describes on a meta copy of :attr:`model`.
    """

    model: nn.Module
    """The module, ideally built under ``torch.device("meta")``; never changed."""
    batch: Any
    """One (global per rank) batch; a tuple or list is unpacked into ``model(*batch)``."""
    optimizer: Callable[[Any], torch.optim.Optimizer]
    """The optimizer factory as given, e.g. ``lambda ps: torch.optim.AdamW(ps, lr=1e-4)``."""
    loss_fn: LossFn | None = None
    """``loss_fn(model, batch) -> loss``; by default the estimate's (the output's ``loss`` or its sum)."""
    strategy: str = "single"
    world_size: int = 1
    precision: str = "32-true"
    device: str = "cuda"
    """``cuda``: the caching allocator's view of the target GPU; ``cpu``: the tensors' bytes."""
    gpu: str | None = None
    torch_version: str | None = None
    device_memory: int | None = None
    """Bytes of the device (the budget): the allocator model releases cached segments before an OOM."""
    steps: int = 2
    checkpoint: checkpointing.Checkpoint | None = None
    """Activation checkpointing applied to the copy: which blocks, whole or selective per op."""
    optimizer_spec: OptimizerSpec | None = None
    """An optimizer that replaces :attr:`optimizer` (another class or ``foreach`` / ``fused``)."""
    set_to_none: bool = True
    """``zero_grad(set_to_none=...)``: ``False`` keeps zeroed gradients between steps."""
    reshard_after_forward: bool = True
    """FSDP2 frees each block's gathered parameters after its forward (and gathers them again in backward)."""
    fsdp_mixed_precision: bool = False
    """FSDP2 ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` on every sharded module."""
    offload: bool = False
    """FSDP2 ``CPUOffloadPolicy``: parameters, gradients and optimizer state kept on the host."""
    mesh_shape: tuple[int, ...] | None = None
    """``(replicate, shard)``: HSDP, sharded within groups of ``shard`` ranks; None: one shard group."""
    parallelize: Callable[[nn.Module, Any], None] | None = None
    """The model's own preparation on the meta copy (a LightningModule's ``configure_model``),
    given the fake device mesh; it decides the sharding, so the FSDP2 options above are not used."""
    mesh_shape_of_parallelize: tuple[tuple[int, ...], tuple[str, ...]] | None = None
    """The mesh ``parallelize`` gets: its shape and dimension names (None: ``(world_size,)``)."""
    micro_batch: int | None = None
    """Rows per micro-batch; ``None`` keeps the batch as given."""
    accumulation: int = 1
    """Micro-batches per optimizer step (gradient accumulation)."""
    labels: tuple[str, ...] = field(default=())
    """The names of the changes applied, in order (for the table)."""

    def rows(self) -> int | None:
        """Rows of the batch as given (the first dimension of its first tensor)."""
        from torch.utils._pytree import tree_leaves

        for t in tree_leaves(self.batch):
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                return int(t.shape[0])
        return None

    def with_change(self, label: str, **changes: Any) -> Plan:
        return dataclasses.replace(self, labels=(*self.labels, label), **changes)


def build_model(plan: Plan) -> nn.Module:
    """The model the plan describes: :attr:`Plan.model` itself, or a meta copy with its changes."""
    if plan.checkpoint is None:
        return plan.model
    model = meta_copy(plan.model)
    checkpointing.apply(model, plan.checkpoint)
    return model


def build_optimizer(plan: Plan) -> Callable[[Any], torch.optim.Optimizer]:
    factory = plan.optimizer_spec.build if plan.optimizer_spec is not None else plan.optimizer
    if plan.set_to_none:
        return factory
    return functools.partial(_keeping_gradients, factory)


def _keeping_gradients(factory: Callable[[Any], torch.optim.Optimizer], params: Any) -> torch.optim.Optimizer:
    opt = factory(params)
    opt.zero_grad = functools.partial(type(opt).zero_grad, opt, set_to_none=False)  # type: ignore[method-assign]
    return opt


def micro_batch(batch: Any, rows: int) -> Any:
    """The first ``rows`` rows of every tensor in ``batch`` that has its first dimension."""
    from torch.utils._pytree import tree_leaves, tree_map_only

    full = next(
        (int(t.shape[0]) for t in tree_leaves(batch) if isinstance(t, torch.Tensor) and t.dim()), None
    )

    def cut(t: torch.Tensor) -> torch.Tensor:
        return t[:rows].clone() if t.dim() and int(t.shape[0]) == full else t

    return tree_map_only(torch.Tensor, cut, batch)


#: Micro-batches an accumulation estimate runs per optimizer step: from the second on, each one
#: starts with the gradients of the ones before resident, so the second's peak is every later one's.
ACCUMULATION_RUN = 2


class _Accumulating:
    """An optimizer's ``step`` and ``zero_grad`` acting only on every ``every``-th call: the
    estimate's steps become micro-batches, gradients accumulating between optimizer steps."""

    def __init__(self, opt: torch.optim.Optimizer, every: int) -> None:
        self.opt, self.every, self.calls = opt, every, {"step": 0, "zero_grad": 0}
        self.step = type(opt).step.__get__(opt)
        self.zero_grad = opt.zero_grad

    def wrap(self) -> torch.optim.Optimizer:
        self.opt.step = functools.partial(self._call, "step", self.step)  # type: ignore[method-assign]
        self.opt.zero_grad = functools.partial(self._call, "zero_grad", self.zero_grad)  # type: ignore[method-assign]
        return self.opt

    def _call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        if self.calls[name] % self.every == 0:
            return fn(*args, **kwargs)
        return None


def _accumulating(
    factory: Callable[[Any], torch.optim.Optimizer], every: int, params: Any
) -> torch.optim.Optimizer:
    return _Accumulating(factory(params), every).wrap()


def build_batch(plan: Plan) -> Any:
    return plan.batch if plan.micro_batch is None else micro_batch(plan.batch, plan.micro_batch)


def sharded_as_planned(plan: Plan) -> bool:
    """Whether FSDP2 is applied as the plan says rather than by the estimate's default sharding."""
    return plan.strategy == "fsdp" and (
        not plan.reshard_after_forward
        or plan.fsdp_mixed_precision
        or plan.offload
        or plan.mesh_shape is not None
    )


def _fully_shard(plan: Plan, model: nn.Module, mesh: Any) -> None:
    """FSDP2 as a training script applies it: every block, then the root, with the plan's policies."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {}
    if plan.fsdp_mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if plan.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for _, container, index in checkpointing.blocks(model):
        fully_shard(
            list(container.children())[index],
            mesh=mesh,
            reshard_after_forward=plan.reshard_after_forward,
            **kwargs,
        )
    fully_shard(model, mesh=mesh, **kwargs)


def estimate(plan: Plan) -> MemoryEstimate:
    """Estimate the plan's step through the estimate's public entry, with every change applied."""
    optimizer = build_optimizer(plan)
    runs = min(plan.accumulation, ACCUMULATION_RUN)
    if runs > 1:
        optimizer = functools.partial(_accumulating, optimizer, runs)
    parallelize, mesh_shape, mesh_dim_names = _parallelisation(plan)
    return estimate_plan(
        build_model(plan),
        build_batch(plan),
        EstimatePlan(
            optimizer=optimizer,
            loss_fn=plan.loss_fn,
            strategy=plan.strategy,
            world_size=plan.world_size,
            precision=plan.precision,
            device=plan.device,
            steps=plan.steps * runs,
            gpu=plan.gpu,
            torch_version=plan.torch_version,
            device_memory=plan.device_memory,
            parallelize=parallelize,
            mesh_shape=mesh_shape,
            mesh_dim_names=mesh_dim_names,
        ),
    )


def _parallelisation(plan: Plan) -> tuple[Callable[..., Any] | None, Any, Any]:
    """The plan's ``parallelize``, mesh shape and dimension names: the user's own, FSDP2 as a
    script applies it (mixed precision, resharding, HSDP), or none (the strategy's default)."""
    if plan.parallelize is not None:
        shape, names = plan.mesh_shape_of_parallelize or (None, None)
        return plan.parallelize, shape, names
    if sharded_as_planned(plan):
        names = ("replicate", "shard") if plan.mesh_shape is not None else None
        return functools.partial(_fully_shard, plan), plan.mesh_shape, names
    return None, None, None
