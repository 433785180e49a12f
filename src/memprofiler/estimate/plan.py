"""``EstimatePlan``: how the training step to estimate runs, in one typed, validated place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate.parallel import strategies
from memprofiler.estimate.parallel.pipeline_plan import PipelinePlan

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
    """Ranks; ``ddp``, ``fsdp`` and ``tp``, or the pipeline's ranks."""
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
    """``fsdp``: the device mesh (None: ``(world_size,)``); its product is ``world_size``. Without
    ``parallelize``, a 2D ``(replicate, shard)`` mesh makes the estimate's own sharding HSDP."""
    mesh_dim_names: tuple[str, ...] | None = None
    """Names of the mesh's dimensions, as ``init_device_mesh`` takes them."""
    optimizer_of_model: Callable[[nn.Module], torch.optim.Optimizer] | None = None
    """Makes the optimizer from the prepared model (a LightningModule's ``configure_optimizers``);
    used instead of ``optimizer``."""
    param_dtype: torch.dtype | None = None
    """``fsdp``: FSDP2's ``MixedPrecisionPolicy(param_dtype=...)``: parameters stay in their dtype
    (``32-true``) and are all-gathered and computed in this one (``torch.bfloat16``)."""
    reduce_dtype: torch.dtype | None = None
    """``fsdp``: ``MixedPrecisionPolicy(reduce_dtype=...)``: gradients are reduce-scattered in this
    dtype (``torch.float32``); None: ``param_dtype``."""
    reshard_after_forward: bool | int | None = None
    """``fsdp``: ``fully_shard``'s argument; None: FSDP2's default (True, the root False)."""
    cpu_offload: bool = False
    """``fsdp``: ``CPUOffloadPolicy()``: not modelled; a plan with it is refused."""
    pipeline: PipelinePlan | None = None
    """Pipeline parallelism over ``world_size`` ranks (strategy ``single``: no data or tensor
    parallelism beside it): the stage split, torch's schedule, the micro-batches. The batch is then
    ``(inputs, target)``; every rank is estimated, the result is the rank with the highest peak and
    ``MemoryEstimate.stages`` gives each."""

    def __post_init__(self) -> None:
        if self.pipeline is not None:
            self._check_pipeline()
        strategies.check(
            self.strategy, self.world_size, self.precision, self.steps, pipeline=self.pipeline is not None
        )
        strategies.check_mesh(self.mesh_shape, self.mesh_dim_names, self.world_size)
        if self.strategy == "tp" and self.parallelize is None:
            raise ConfigError(
                "parallelize",
                "strategy 'tp' needs the model's tensor-parallel plan: a `parallelize(model, mesh)` that calls "
                "`parallelize_module`",
            )
        fsdp_only = {
            "param_dtype": self.param_dtype is not None,
            "reduce_dtype": self.reduce_dtype is not None,
            "reshard_after_forward": self.reshard_after_forward is not None,
        }
        for name, given in fsdp_only.items():
            if given and self.strategy != "fsdp":
                raise ConfigError(name, f"applies to strategy 'fsdp' only (got {self.strategy!r})")
        if self.mesh_shape is not None and self.strategy not in ("fsdp", "tp"):
            raise ConfigError(
                "mesh_shape", f"applies to strategies 'fsdp' and 'tp' only (got {self.strategy!r})"
            )
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point):
                raise ConfigError(
                    name, f"got {value!r}; use a floating-point torch.dtype, e.g. torch.bfloat16"
                )
        if self.cpu_offload:
            raise ConfigError(
                "cpu_offload",
                "FSDP2's CPUOffloadPolicy is not modelled (sharded parameters, gradients and optimizer "
                "state would move to the host); estimate without it for an upper bound",
            )

    def _check_pipeline(self) -> None:
        if not isinstance(self.pipeline, PipelinePlan):
            raise ConfigError("pipeline", f"got {type(self.pipeline).__name__}; pass a PipelinePlan(...)")
        if self.strategy != "single":
            raise ConfigError(
                "pipeline",
                f"got strategy {self.strategy!r}; a pipeline is modelled alone (strategy 'single', each "
                "rank one stage's process)",
            )
        if not isinstance(self.world_size, int) or isinstance(self.world_size, bool) or self.world_size < 2:
            raise ConfigError("world_size", f"got {self.world_size!r}; a pipeline needs its ranks: 2 or more")
        given = {"loss_fn": self.loss_fn, "parallelize": self.parallelize, "shard_policy": self.shard_policy}
        for name, value in given.items():
            if value is not None:
                raise ConfigError(
                    name,
                    "does not apply with a pipeline: `pipeline.split` gives each stage's module and "
                    "`pipeline.loss_fn(output, target)` the loss",
                )

    def fsdp_options(self) -> dict[str, Any]:
        """``fully_shard``'s keyword arguments this plan gives (its mixed precision, resharding).

        Example:
            >>> import torch
            >>> EstimatePlan(strategy="fsdp", param_dtype=torch.bfloat16).fsdp_options()["mp_policy"].param_dtype
            torch.bfloat16
        """
        out: dict[str, Any] = {}
        if self.param_dtype is not None or self.reduce_dtype is not None:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            out["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype
            )
        if self.reshard_after_forward is not None:
            out["reshard_after_forward"] = self.reshard_after_forward
        return out

    def mesh(self) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
        """The mesh's shape and names: ``(world_size,)``, or ``mesh_shape`` (2D: HSDP's
        ``("replicate", "shard")`` unless named)."""
        shape = self.mesh_shape or (self.world_size,)
        names = self.mesh_dim_names
        if names is None and len(shape) == 2 and self.parallelize is None:
            names = ("replicate", "shard")
        return shape, names
