"""How each parallel strategy changes one rank's memory: a fake process group, FSDP2
sharding, DDP's gradient buckets, and the precision a step runs in."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from memprofiler.errors import ConfigError

STRATEGIES = ("single", "ddp", "fsdp", "tp")
#: Strategies that run on a fake process group of ``world_size`` ranks.
DISTRIBUTED = ("fsdp", "tp")
NOT_SUPPORTED = "pipeline parallelism is `EstimatePlan(pipeline=...)`; context parallelism is not modelled"
#: Lightning's precision names to (autocast dtype, parameter dtype).
PRECISIONS: dict[str, tuple[torch.dtype | None, torch.dtype]] = {
    "32-true": (None, torch.float32),
    "32": (None, torch.float32),
    "64-true": (None, torch.float64),
    "bf16-mixed": (torch.bfloat16, torch.float32),
    "16-mixed": (torch.float16, torch.float32),
    "bf16-true": (None, torch.bfloat16),
    "16-true": (None, torch.float16),
}
#: DDP's defaults (``torch.distributed.constants``): the first bucket is small so the first
#: all-reduce starts early.
DDP_FIRST_BUCKET = 1 << 20
DDP_BUCKET_CAP_MB = 25
#: The device of every tensor an estimate makes (fake or real) and of its device mesh, on every
#: machine: autograd on fake CUDA tensors aborts a CPU-only build of torch, so the one device
#: that gives the same figures on a laptop and on a GPU node is the CPU. The ``device``
#: argument picks the accounting (the CUDA caching allocator's view, or the tensors' bytes).
RUN_DEVICE = "cpu"


def check(strategy: str, world_size: int, precision: str, steps: int, pipeline: bool = False) -> None:
    """Raise :class:`ConfigError` naming the argument for a value no estimate can use; ``pipeline``:
    the ranks are a pipeline's (strategy ``single`` over ``world_size`` ranks)."""
    if strategy not in STRATEGIES:
        raise ConfigError(
            "strategy", f"got {strategy!r}; use one of {', '.join(STRATEGIES)} ({NOT_SUPPORTED})"
        )
    # bool is an int to Python: `world_size=True` would be estimated as 1 rank
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError("world_size", f"got {world_size!r}; use an integer >= 1")
    if strategy == "single" and world_size != 1 and not pipeline:
        raise ConfigError(
            "world_size", f"got {world_size} with strategy 'single'; use 'ddp', 'fsdp', 'tp' or a pipeline"
        )
    if precision not in PRECISIONS:
        raise ConfigError("precision", f"got {precision!r}; use one of {', '.join(PRECISIONS)}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError("steps", f"got {steps!r}; use an integer >= 1 (2 covers optimizer state)")


def check_mesh(shape: tuple[int, ...] | None, names: tuple[str, ...] | None, world_size: int) -> None:
    """Raise :class:`ConfigError` for a device mesh that does not cover ``world_size`` ranks."""
    if shape is None:
        if names is not None and len(names) != 1:
            raise ConfigError("mesh_dim_names", f"got {names!r} for the 1D mesh; give `mesh_shape` too")
        return
    if not shape or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in shape):
        raise ConfigError("mesh_shape", f"got {shape!r}; use a tuple of integers >= 1, e.g. (2, 4)")
    if math.prod(shape) != world_size:
        raise ConfigError(
            "mesh_shape",
            f"got {shape!r} ({math.prod(shape)} ranks) with world_size {world_size}; they must agree",
        )
    if names is not None and len(names) != len(shape):
        raise ConfigError("mesh_dim_names", f"got {len(names)} names for a {len(shape)}D mesh {shape!r}")


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """Initialise torch's fake process group (rank ``rank`` of ``world_size``) for the block."""
    if dist.is_initialized():
        raise ConfigError(
            "strategy",
            "a process group is already initialised; estimate in a process without one (the CLI does)",
        )
    import torch.testing._internal.distributed.fake_pg as fake_pg  # registers the "fake" backend

    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def device_mesh(shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Any:
    """A device mesh on :data:`RUN_DEVICE` over the fake process group, never on this machine's GPU."""
    from torch.distributed.device_mesh import init_device_mesh

    with torch.device(RUN_DEVICE):  # the mesh's rank tensor, whatever the default device
        return init_device_mesh(RUN_DEVICE, shape, mesh_dim_names=names)


#: Where ``fully_shard`` builds its mesh when given none: on ``torch._C._get_accelerator()``,
#: CUDA on a GPU node. The names differ between torch versions.
_DEFAULT_MESH_BUILDERS = ("_init_default_mesh", "_init_default_fully_shard_mesh")


@contextlib.contextmanager
def default_mesh_on_run_device(world_size: int) -> Iterator[None]:
    """While the block shards the meta copy, ``fully_shard(module)`` with no ``mesh`` (a
    ``configure_model`` may call it so) gets one mesh on :data:`RUN_DEVICE` instead of one on
    the machine's accelerator, whose parameters would sit on another device than the steps'."""
    try:
        from torch.distributed.fsdp._fully_shard import _fully_shard as impl
    except ImportError:  # a torch that keeps fully_shard elsewhere: its own pick stands
        yield
        return
    built: list[Any] = []

    def ours(*args: Any, **kwargs: Any) -> Any:
        if not built:
            built.append(device_mesh((world_size,), kwargs.get("mesh_dim_names")))
        return built[0]

    saved = {name: getattr(impl, name) for name in _DEFAULT_MESH_BUILDERS if hasattr(impl, name)}
    for name in saved:
        setattr(impl, name, ours)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(impl, name, fn)


def fully_shard_model(
    model: nn.Module, mesh: Any, policy: Callable[[nn.Module], bool] | None, **options: Any
) -> None:
    """Apply FSDP2's ``fully_shard`` (with ``options``) to the modules ``policy`` picks, then to the
    root; a 2D ``mesh`` ``(replicate, shard)`` makes it HSDP."""
    from torch.distributed.fsdp import fully_shard

    picked: list[nn.Module] = []
    if policy is None:
        for m in model.modules():
            if isinstance(m, nn.ModuleList):
                picked.extend(m)
    else:
        picked = [m for m in model.modules() if m is not model and policy(m)]
    for m in picked:
        fully_shard(m, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)


def has_fsdp(model: nn.Module) -> bool:
    """Whether FSDP2's ``fully_shard`` was applied anywhere in ``model`` (its tracker needs it)."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def is_fully_sharded(model: nn.Module) -> bool:
    return any(callable(getattr(p, "to_local", None)) for p in model.parameters())


def ddp_buckets(model: nn.Module, bucket_cap_mb: float = DDP_BUCKET_CAP_MB) -> list[int]:
    """Bytes of each gradient bucket DDP's reducer allocates (``gradient_as_bucket_view=False``).

    Parameters go in reverse registration order, one bucket list per dtype; a bucket closes
    once it reaches its limit: 1 MiB for the first, ``bucket_cap_mb`` after.
    """
    cap = int(bucket_cap_mb * (1 << 20))
    open_: dict[torch.dtype, list[int]] = {}  # dtype -> [bytes so far, buckets closed]
    sizes: list[int] = []
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        cur = open_.setdefault(p.dtype, [0, 0])
        cur[0] += p.numel() * p.element_size()
        if cur[0] >= (DDP_FIRST_BUCKET if cur[1] == 0 else cap):
            sizes.append(cur[0])
            cur[0], cur[1] = 0, cur[1] + 1
    sizes.extend(cur[0] for cur in open_.values() if cur[0])
    return sizes


def autocast(precision: str, device: str) -> contextlib.AbstractContextManager[Any]:
    dtype = PRECISIONS[precision][0]
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def param_dtype(precision: str) -> torch.dtype:
    return PRECISIONS[precision][1]


def input_dtype(precision: str) -> torch.dtype | None:
    """The dtype a ``-true`` precision converts a batch's floating-point tensors to (Lightning's
    ``convert_input``, on the host before the batch moves to the device); None: left as given."""
    dtype = param_dtype(precision)
    return dtype if precision.endswith("-true") and dtype != torch.float32 else None
