"""``advise``: which changes make a training step fit a memory budget, each one estimated."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memprofiler.advice import budget as budgets
from memprofiler.advice import candidates as cands
from memprofiler.advice import search
from memprofiler.advice.checkpointing import need_blocks
from memprofiler.advice.flops import ForwardFlops, recording
from memprofiler.advice.plan import Plan
from memprofiler.advice.progress import Progress
from memprofiler.advice.result import Advice, Row
from memprofiler.errors import ConfigError
from memprofiler.estimate import default_loss


def advise(
    model: nn.Module,
    batch: Any,
    *,
    optimizer: Callable[[Any], torch.optim.Optimizer],
    budget: int | str,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    world_size: int = 1,
    strategy: str = "single",
    precision: str = "32-true",
    device: str = "cuda",
    gpu: str | None = None,
    torch_version: str | None = None,
    reserve: int | str = 0,
    candidates: list[str] | None = None,
    set_to_none: bool = True,
    reshard_after_forward: bool = True,
    fsdp_mixed_precision: bool = False,
    offload: bool = False,
    mesh_shape: tuple[int, int] | None = None,
    steps: int = 2,
    progress: bool | None = None,
    jobs: int | None = None,
) -> Advice:
    """Estimate the step as given and with each change that applies; rank the changes that fit.

    Every figure comes from :func:`memprofiler.estimate_memory` run on a copy of the model and
    plan with the change applied. When no single change fits, sets of changes are estimated
    together, smallest first. Arguments as :func:`memprofiler.estimate_memory`'s, plus:

    Args:
        budget: bytes one device may take (``"80GiB"`` or a number); "fits" is decided on the
            estimate's reserved peak plus its stated margins plus ``reserve``.
        reserve: bytes kept back for what is not modelled (the CUDA context).
        candidates: the names to try (:data:`memprofiler.advice.candidates.NAMES`); all by default.
        set_to_none: ``False`` when the training loop calls ``zero_grad(set_to_none=False)``.
        reshard_after_forward: FSDP2's argument for each block (``strategy="fsdp"``).
        fsdp_mixed_precision: FSDP2 ``MixedPrecisionPolicy`` of bf16 parameters and fp32 reduction.
        offload: FSDP2 ``CPUOffloadPolicy`` (fake tensors cannot pin memory: it cannot be estimated).
        mesh_shape: an HSDP mesh ``(replicate, shard)``; None shards over all ranks.
        progress: a status line on stderr while estimating (default: when stderr is a terminal;
            asked for where stderr is no terminal, one plain line per estimate).
        jobs: estimates run at once, one process each (default: one per core, or
            ``MEMPROFILER_JOBS``; 1: one after another in this process).

    Raises:
        ConfigError: a budget of 0 or above the target GPU's memory, an unknown candidate, a
            checkpointing candidate named for a model with no blocks, or what the estimate refuses.

    Example:
        >>> import torch
        >>> with torch.device("meta"):
        ...     net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
        >>> adam = lambda ps: torch.optim.Adam(ps, lr=1e-3)
        >>> advice = advise(net, torch.randn(64, 256), optimizer=adam, budget="200MiB", progress=False)
        >>> advice.base.fits
        True
    """
    cands.check_names(candidates)
    if offload:
        raise ConfigError("offload", cands.OFFLOAD + "; advise the plan without it")
    gpu_name = _gpu_key(gpu)
    limit = budgets.parse_budget(budget, gpu_name or "")
    keep = int(budgets.parse_size(str(reserve), "reserve"))
    base = Plan(
        model=model,
        batch=batch,
        optimizer=optimizer,
        loss_fn=loss_fn,
        strategy=strategy,
        world_size=world_size,
        precision=precision,
        device=device,
        gpu=gpu,
        torch_version=torch_version,
        device_memory=limit,
        steps=steps,
        set_to_none=set_to_none,
        reshard_after_forward=reshard_after_forward,
        fsdp_mixed_precision=fsdp_mixed_precision,
        offload=offload,
        mesh_shape=mesh_shape,
    )
    return advise_plan(base, limit, keep, candidates, progress, jobs)


def _gpu_key(gpu: str | None) -> str | None:
    if gpu is None:
        return None
    key = gpu.upper().replace(" ", "").replace("-", "")
    return key if key in budgets.DEVICE_MEMORY_GIB else None


def advise_plan(
    base: Plan,
    budget: int,
    reserve: int,
    names: list[str] | None = None,
    progress: bool | None = None,
    jobs: int | None = None,
) -> Advice:
    """:func:`advise` on a :class:`Plan` (the Lightning subcommand builds one from its config)."""
    cands.check_names(names)
    if any(n.startswith("checkpoint-") for n in names or []):  # asked for by name: said before estimating
        need_blocks(base.model, "candidates")
    flops = ForwardFlops()
    recorded = dataclasses.replace(base, loss_fn=recording(base.loss_fn or default_loss, flops))
    with Progress(progress) as bar:
        est = search.Estimator(recorded, budget, reserve, bar, jobs, flops)
        ctx = cands.Context.of(base, flops)  # its FLOPs are read once the base has run
        found, skipped = cands.candidates(ctx, names)

        target: list[str] = []

        def check(row: Row) -> None:
            target.append(est.target)
            if base.gpu is None:  # the default target's memory bounds the budget too
                budgets.parse_budget(budget, est.target.split(" ")[0])

        singles = search.singles(est, found, on_base=check)  # the base estimated beside them
        base_row = est.base()
        advice = Advice(
            budget=budget, reserve=reserve, base=base_row, rows=[], skipped=skipped, target=target[0]
        )
        advice.rows = search.rank([row for _, row in singles])
        fitting = [r for r in advice.rows if r.fits]
        if base_row.fits:
            advice.best = base_row
        elif fitting:
            advice.best = fitting[0]
        else:
            advice.combinations = search.rank(search.combinations(est, singles))
            advice.best = next((r for r in advice.combinations if r.fits), None)
        if advice.best is None:
            every = advice.rows + advice.combinations
            advice.closest = max(every, key=lambda r: r.headroom_bytes) if every else base_row
        advice.skipped.update(est.failed)
        advice.estimates = est.runs
    return advice
