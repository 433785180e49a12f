"""``EstimatePlan``: how the training step to estimate runs, in one typed, validated place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate.parallel import strategies

LossFn = Callable[[nn.Module, Any], torch.Tensor]
OptimizerFn = Callable[[Any], torch.optim.Optimizer]
#: ``parallelize(model, mesh)``: shards or wraps the meta model in place, as a training script
#: does; ``mesh`` is the fake device mesh of the plan's shape (None without a process group).
ParallelizeFn = Callable[[nn.Module, Any], None]


@dataclass(frozen=True)
class EstimatePlan:
    """One rank's training step, as :func:`memprofiler.estimate.estimate_plan` runs it.

    Every field has a default but ``optimizer``; a bad value raises :class:`ConfigError` naming
    the field when the plan is built.

    Example:
        >>> import torch
        >>> plan = EstimatePlan(optimizer=lambda ps: torch.optim.AdamW(ps), strategy="fsdp", world_size=8)
        >>> plan.world_size
        8
    """

    optimizer: OptimizerFn | None = None
    """Takes the parameters, returns the optimizer, e.g. ``lambda ps: torch.optim.AdamW(ps, lr=1e-4)``."""
    loss_fn: LossFn | None = None
    """``loss_fn(model, batch) -> loss``; None: the output's ``loss`` (key or attribute), itself
    when scalar, else its sum."""
    strategy: str = "single"
    """``single``, ``ddp`` (full replica plus gradient buckets), ``fsdp`` (FSDP2) or ``tp``
    (tensor / sequence parallelism: ``parallelize`` shards the model with DTensor on the fake
    mesh, and nothing else is sharded)."""
    world_size: int = 1
    """Ranks; ``ddp``, ``fsdp`` and ``tp`` only."""
    precision: str = "32-true"
    """Lightning's names: ``32-true``, ``bf16-mixed`` (autocast), ``bf16-true``, ..."""
    device: str = "cuda"
    """``cuda``: the caching allocator's view of a CUDA target; ``cpu``: the tensors' bytes."""
    steps: int = 2
    """Training steps to run; 2 covers optimizer state created lazily in the first."""
    fake: bool = True
    """False: real CPU tensors, for a model that cannot run on fake ones."""
    gpu: str | None = None
    """The CUDA target: a name (``H100``) or a compute capability (``9.0``); None: this machine's
    GPU, else H100."""
    torch_version: str | None = None
    """The torch release the job will run (None: this one); workspace rules follow it."""
    device_memory: int | None = None
    """Bytes of the device: the allocator model releases cached segments before an OOM as torch does."""
    shard_policy: Callable[[nn.Module], bool] | None = None
    """``fsdp`` without ``parallelize``: the submodules ``fully_shard`` is applied to before the
    root (None: every item of every ``nn.ModuleList``)."""
    parallelize: ParallelizeFn | None = None
    """The model's own parallelisation, called on the meta copy before the steps: ``fully_shard``,
    checkpoint wrappers, a LightningModule's ``configure_model``. Under ``fsdp`` and ``tp`` it gets
    the fake device mesh (2D FSDP + TP: a ``(dp, tp)`` mesh, ``parallelize_module`` on
    ``mesh["tp"]`` and ``fully_shard`` on ``mesh["dp"]``); under ``fsdp`` the estimate shards
    nothing itself unless it left the model unsharded."""
    mesh_shape: tuple[int, ...] | None = None
    """The mesh ``parallelize`` gets (None: ``(world_size,)``); its product is ``world_size``."""
    mesh_dim_names: tuple[str, ...] | None = None
    """Names of the mesh's dimensions, as ``init_device_mesh`` takes them."""
    optimizer_of_model: Callable[[nn.Module], torch.optim.Optimizer] | None = None
    """Makes the optimizer from the prepared model (a LightningModule's ``configure_optimizers``);
    used instead of ``optimizer``."""

    def __post_init__(self) -> None:
        strategies.check(self.strategy, self.world_size, self.precision, self.steps)
        strategies.check_mesh(self.mesh_shape, self.mesh_dim_names, self.world_size)
        if self.strategy == "tp" and self.parallelize is None:
            raise ConfigError(
                "parallelize",
                "strategy 'tp' needs the model's tensor-parallel plan: a `parallelize(model, mesh)` that calls "
                "`parallelize_module`",
            )
