"""``estimate_plan`` and ``estimate_memory``: will a training step fit? Its per-rank peak, before running it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from memprofiler.estimate import engine
from memprofiler.estimate.batch_search import BatchSearch, search
from memprofiler.estimate.cuda.devices import CUDA_CONTEXT
from memprofiler.estimate.plan import EstimatePlan
from memprofiler.estimate.probe import Probe
from memprofiler.estimate.result import MemoryEstimate


def estimate_plan(
    model: nn.Module, batch: Any, plan: EstimatePlan, *, probe: Probe | None = None
) -> MemoryEstimate:
    """Estimate one rank's peak memory of the training step ``plan`` describes, allocating nothing.

    Each of ``plan.steps`` steps runs forward, the loss, backward, ``optimizer.step()`` and
    ``zero_grad()`` on fake tensors with a fake process group of ``plan.world_size`` ranks, so no
    GPU is needed and a model built on the meta device costs no host memory. The model is
    copied, never changed.

    Args:
        model: the module, ideally built under ``torch.device("meta")``.
        batch: one batch; a tuple or list is unpacked into ``model(*batch)``.
        plan: how the step runs (:class:`EstimatePlan`).
        probe: for tools that watch the steps (:class:`memprofiler.estimate.probe.Probe`).

    Raises:
        ConfigError: a bad argument, or the model cannot run on fake tensors (the message
            names the op and the module and suggests ``fake=False``).

    Example:
        >>> import torch
        >>> with torch.device("meta"):
        ...     net = torch.nn.Linear(1024, 1024)
        >>> plan = EstimatePlan(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
        >>> estimate_plan(net, torch.randn(8, 1024), plan).resident["parameters"]
        4198400
    """
    return engine.estimate(model, batch, plan, probe)


def estimate_memory(
    model: nn.Module,
    batch: Any,
    *,
    optimizer: engine.OptimizerFn,
    loss_fn: engine.LossFn | None = None,
    world_size: int = 1,
    strategy: str = "single",
    precision: str = "32-true",
    device: str = "cuda",
    steps: int = 2,
    fake: bool = True,
    shard_policy: Callable[[nn.Module], bool] | None = None,
    gpu: str | None = None,
    torch_version: str | None = None,
    device_memory: int | None = None,
) -> MemoryEstimate:
    """Estimate one rank's peak memory of ``steps`` training steps, allocating nothing.

    The keywords are :class:`EstimatePlan`'s fields; :func:`estimate_plan` takes the plan itself,
    with the model's own parallelisation (``parallelize``) too.

    Each step runs forward, the loss, backward, ``optimizer.step()`` and ``zero_grad()`` on
    fake tensors with a fake process group of ``world_size`` ranks, so no GPU is needed and a
    model built on the meta device costs no host memory. The model is copied, never changed.

    Args:
        model: the module, ideally built under ``torch.device("meta")``.
        batch: one batch; a tuple or list is unpacked into ``model(*batch)``.
        optimizer: takes the parameters, returns the optimizer,
            e.g. ``lambda ps: torch.optim.AdamW(ps, lr=1e-4)``.
        loss_fn: ``loss_fn(model, batch) -> loss``; by default the output's ``loss`` (dict
            key or attribute), itself when scalar, else its sum.
        world_size: ranks; ``ddp``, ``fsdp`` and ``tp`` only.
        strategy: ``single``, ``ddp`` (full replica plus gradient buckets) or ``fsdp``
            (FSDP2 ``fully_shard`` on every ``nn.ModuleList`` item and the root, or on the
            modules ``shard_policy`` picks); ``tp`` (tensor parallelism) needs the model's plan,
            which :func:`estimate_plan` takes (``parallelize``), as it takes a pipeline
            (``pipeline``).
        precision: Lightning's names: ``32-true``, ``bf16-mixed`` (autocast), ``bf16-true``, ...
        device: ``cuda`` reports the caching allocator's view; ``cpu`` the tensors' bytes.
            Either way the steps run on CPU tensors, on every machine, so a GPU node and a
            laptop give the same figures.
        steps: steps to run; 2 covers optimizer state created lazily in the first.
        fake: ``False`` runs on real CPU tensors, for models that cannot run fake.
        shard_policy: which submodules ``fsdp`` shards apart from the root.
        gpu: the CUDA target (``device="cuda"``): a name (``H100``, ``A100``, ``H200``) or a
            compute capability (``9.0``, ``sm90``). Default: this machine's GPU, else H100. It
            decides the cuBLAS workspace sizes and the attention kernel CUDA would pick.
        torch_version: the torch release the job will run (default: this one); workspace rules
            changed between releases.
        device_memory: bytes of the device; the allocator model then releases cached segments
            before an OOM as torch's does (``PYTORCH_CUDA_ALLOC_CONF`` is read from the environment).

    Raises:
        ConfigError: a bad argument, or the model cannot run on fake tensors (the message
            names the op and the module and suggests ``fake=False``).

    Example:
        >>> import torch
        >>> with torch.device("meta"):
        ...     net = torch.nn.Linear(1024, 1024)
        >>> est = estimate_memory(net, torch.randn(8, 1024), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
        >>> est.resident["parameters"]
        4198400
    """
    plan = EstimatePlan(
        optimizer=optimizer,
        loss_fn=loss_fn,
        strategy=strategy,
        world_size=world_size,
        precision=precision,
        device=device,
        steps=steps,
        fake=fake,
        shard_policy=shard_policy,
        gpu=gpu,
        torch_version=torch_version,
        device_memory=device_memory,
    )
    return engine.estimate(model, batch, plan)


def largest_batch(
    model: nn.Module,
    make_batch: Callable[[int], Any],
    *,
    device_memory: int,
    reserve: int = CUDA_CONTEXT,
    **options: Any,
) -> BatchSearch:
    """The largest batch that fits ``device_memory``, from Python: a few estimates, not a doubling.

    Args:
        model: the module (ideally on the meta device).
        make_batch: ``make_batch(rows) -> batch``.
        device_memory: bytes of one device (:data:`memprofiler.estimate.cuda.devices.MEMORY`).
        reserve: bytes kept back; by default the CUDA context.
        options: the other keywords of :func:`estimate_memory` (``optimizer`` included).

    Example:
        >>> found = largest_batch(model, lambda n: torch.randint(0, 32000, (n, 4096)),  # doctest: +SKIP
        ...     device_memory=80 * 2**30, optimizer=lambda ps: torch.optim.AdamW(ps), strategy="fsdp")
        >>> found.largest, found.estimate.peak_bytes  # doctest: +SKIP
    """

    def one(rows: int) -> MemoryEstimate:
        est = estimate_memory(model, make_batch(rows), device_memory=device_memory, **options)
        est.batch_size = rows
        return est

    return search(one, device_memory, reserve)
