"""``MemProfilerCLI advise``: which changes make the fit config fit a memory budget, each estimated.

.. code-block:: bash

    python train.py advise --config fit.yaml --advise.budget 80GiB --advise.world_size 8

The model, data, ``trainer.strategy`` / ``trainer.precision``, ``configure_model`` and
``configure_optimizers`` are read as the ``estimate`` subcommand reads them; every candidate change is
estimated on a copy (see :func:`memprofiler.advise`) and the answer is printed as the YAML keys to
change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from memprofiler.advice.api import advise_plan
from memprofiler.advice.budget import parse_budget
from memprofiler.advice.candidates import check_names
from memprofiler.advice.optimizers import inspect_factory
from memprofiler.advice.plan import Plan
from memprofiler.advice.table import render
from memprofiler.errors import ConfigError
from memprofiler.estimate import as_loss
from memprofiler.lightning import estimate as est
from memprofiler.units import parse_size

GROUP = "advise"
HELP = "Rank the changes that make the fit config fit a memory budget, each one estimated (no GPU)."


@dataclass
class AdviseConfig:
    """Options of the ``advise`` subcommand (``--advise.*``)."""

    budget: str | None = None
    """Memory one device may take, e.g. ``80GiB`` (required)."""
    world_size: int = 1
    """Ranks (data-parallel size)."""
    reserve: str = "0"
    """Bytes kept back for what is not modelled (the CUDA context, about 500 MiB)."""
    candidates: list[str] | None = None
    """Candidate names to try (``checkpoint-full``, ``bf16-mixed``, ``micro-batch``, ...); all by default."""
    steps: int = 2
    """Training steps per estimate; 2 covers optimizer state created in the first."""
    device: str = "cuda"
    """``cuda`` reports the caching allocator's view; ``cpu`` the tensors' bytes."""
    gpu: str | None = None
    """The CUDA target (``H100``, ``A100``, ...); default this machine's GPU, else H100."""
    torch_version: str | None = None
    """The torch release the job will run, e.g. ``2.11`` (default: the installed one)."""
    progress: bool | None = None
    """A status line on stderr while the estimates run (default: when stderr is a terminal)."""


def _training_step_loss(model: nn.Module, batch: Any) -> Any:
    return as_loss(model.training_step(batch, 0))  # type: ignore[operator]


def run_advise(cli: Any) -> None:
    """The ``advise`` subcommand: estimate the plan and every change, print the table and the patch."""
    cfg_init = cli.config_init[GROUP]
    opts = cfg_init[GROUP]
    opts = opts if isinstance(opts, AdviseConfig) else AdviseConfig(**dict(opts))
    if not opts.budget:
        raise ConfigError(
            f"{GROUP}.budget", "set the memory one device may take, e.g. `--advise.budget 80GiB`"
        )
    check_names(opts.candidates, f"{GROUP}.candidates")
    gpu = (opts.gpu or "").upper().replace(" ", "").replace("-", "")
    budget = parse_budget(opts.budget, gpu, f"{GROUP}.budget")
    reserve = int(parse_size(opts.reserve, f"{GROUP}.reserve"))
    trainer_cfg = dict(cfg_init.get("trainer") or {})
    strategy = est._strategy(trainer_cfg, opts.world_size)
    precision = est._precision(trainer_cfg)
    model, data = cli.model, cli.datamodule
    spec = inspect_factory(lambda params: est._optimizer_of(model))
    if spec is None:
        raise ConfigError("model.configure_optimizers", "advise needs it to return a torch.optim.Optimizer")
    plan = Plan(
        model=model,
        batch=est._first_batch(model, data, None),
        optimizer=spec.build,
        loss_fn=_training_step_loss,
        strategy=strategy,
        world_size=opts.world_size,
        precision=precision,
        device=opts.device,
        gpu=opts.gpu,
        torch_version=opts.torch_version,
        device_memory=budget,
        steps=opts.steps,
        parallelize=est._configure_model,
        mesh_shape_of_parallelize=(
            ((opts.world_size, 1), ("data_parallel", "tensor_parallel")) if strategy == "fsdp" else None
        ),
    )
    advice = advise_plan(plan, budget, reserve, opts.candidates, opts.progress)
    print(render(advice, yaml=True))
