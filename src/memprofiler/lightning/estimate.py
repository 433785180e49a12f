"""``MemProfilerCLI estimate``: will the fit config fit? One rank's peak, from the same YAML.

.. code-block:: bash

    python train.py estimate --config fit.yaml --estimate.world_size 1024 \\
        --estimate.device_memory 80GiB --estimate.batch_size auto

The model, data, ``trainer.strategy`` / ``trainer.precision``, ``configure_model`` and
``configure_optimizers`` are taken from the config unchanged. No Trainer is built and nothing
is allocated: the model is instantiated on the meta device and the steps run on fake tensors
(see :func:`memprofiler.estimate_memory`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser
from torch import nn

from memprofiler.config import urls
from memprofiler.errors import ConfigError, MemProfilerError
from memprofiler.estimate import EstimatePlan, batch_search, engine, estimate_plan
from memprofiler.estimate.output import render_table, write_estimates
from memprofiler.estimate.parallel import strategies
from memprofiler.estimate.result import MemoryEstimate
from memprofiler.lightning import _compat as compat
from memprofiler.output import remote
from memprofiler.units import parse_size

GROUP = "estimate"
HELP = "Estimate one rank's peak memory of the fit config, on fake tensors (no GPU)."


@dataclass
class EstimateConfig:
    """Options of the ``estimate`` subcommand (``--estimate.*``)."""

    world_size: int = 1
    """Ranks to estimate for (data-parallel size)."""
    device_memory: str | None = None
    """Memory of one device, e.g. ``80GiB``: the estimate then says fits / does not fit."""
    batch_size: list[int] | Literal["auto"] | None = None
    """Batch sizes to estimate, or ``auto`` for the largest that fits ``device_memory``."""
    reserve: str = "0"
    """Bytes kept back for what is not modelled (the CUDA context, about 500 MiB; workspaces and NCCL are modelled)."""
    fake: bool = True
    """``false`` runs real CPU tensors, for models that cannot run on fake tensors."""
    steps: int = 2
    """Training steps per estimate; 2 covers optimizer state created in the first."""
    device: str = "cuda"
    """``cuda`` reports the caching allocator's view; ``cpu`` the tensors' bytes."""
    gpu: str | None = None
    """The CUDA target: ``H100``, ``A100``, ``H200``, ... or a compute capability (``9.0``, ``sm90``);
    default this machine's GPU, else H100. Decides workspace sizes and the attention kernel."""
    torch_version: str | None = None
    """The torch release the job will run, e.g. ``2.11`` (default: the installed one)."""
    save_dir: str | None = None
    """Where ``memory_estimate.yaml`` goes (default: ``memprofiler.save_dir``, else ``./memprofiler``)."""


class EstimateSubcommand:
    """Mixin for a ``LightningCLI``: adds the ``estimate`` subcommand beside ``fit``.

    ``estimate`` parses the same config as ``fit`` plus ``--estimate.*``, instantiates the
    model on the meta device and the data module as usual, builds no Trainer, and runs
    :func:`run_estimate`.
    """

    subcommand: str | None
    parser: Any
    #: Subcommands that parse the fit config, build the model on the meta device and no Trainer:
    #: name -> (the dataclass of their ``--name.*`` options, the function run, the help line).
    META_SUBCOMMANDS: dict[str, tuple[type, Any, str]] = {
        GROUP: (EstimateConfig, lambda cli: run_estimate(cli), HELP)
    }

    @classmethod
    def subcommands(cls) -> dict[str, set[str]]:
        from lightning.pytorch.cli import LightningCLI

        return {
            **LightningCLI.subcommands(),
            **{name: {"model", "datamodule"} for name in cls.META_SUBCOMMANDS},
        }

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        sub = parser.add_subcommands()
        cli: Any = self
        compat.start_subcommands(cli)
        trainer_class = cli.trainer_class
        for name in self.subcommands():
            if name in self.META_SUBCOMMANDS:
                options, _, help_ = self.META_SUBCOMMANDS[name]
                sp = cli.init_parser(**{"description": help_, **kwargs.get(name, {})})
                compat.add_arguments(cli, sp)
                sp.add_class_arguments(options, name)
                compat.register_subcommand(cli, name, sp, method_arguments={})
            else:
                help_ = compat.short_description(getattr(trainer_class, name)) or name
                sp = compat.prepare_subcommand_parser(
                    cli, trainer_class, name, **{"description": help_, **kwargs.get(name, {})}
                )
                compat.register_subcommand(cli, name, sp)
            sub.add_subcommand(name, sp, help=help_)

    def _add_instantiators(self) -> None:
        super()._add_instantiators()  # type: ignore[misc]
        if self.subcommand in self.META_SUBCOMMANDS:
            cli: Any = self
            instantiator, model_type = compat.model_instantiator(cli, _OnMeta)
            self.parser.add_instantiator(instantiator, model_type, subclasses=cli.subclass_mode_model)

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # No Trainer for an estimate: it would check devices this machine does not have.
        if self.subcommand in self.META_SUBCOMMANDS:
            return None
        return super().instantiate_trainer(**kwargs)  # type: ignore[misc]

    def _run_subcommand(self, subcommand: str) -> None:
        if subcommand in self.META_SUBCOMMANDS:
            try:
                self.META_SUBCOMMANDS[subcommand][1](self)
            except MemProfilerError as err:  # the user's mistake: one line, exit code 2
                cli: Any = self
                compat.subcommand_parser(cli, subcommand).error(str(err))
            return
        super()._run_subcommand(subcommand)  # type: ignore[misc]


class _OnMeta:
    """Wraps Lightning's model instantiator so the model's own ``__init__`` allocates nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(
        self, class_type: type, *args: Any, applied_instantiation_links: dict[str, Any], **kwargs: Any
    ) -> Any:
        with torch.device("meta"):
            return self.inner(
                class_type, *args, applied_instantiation_links=applied_instantiation_links, **kwargs
            )


def _strategy(trainer_cfg: dict[str, Any], world_size: int) -> str:
    strat = trainer_cfg.get("strategy", "auto")
    name = strat if isinstance(strat, str) else type(strat).__name__
    key = f"{GROUP}.world_size / trainer.strategy"
    if name in ("auto", "single_device", "SingleDeviceStrategy"):
        return "single" if world_size == 1 else "ddp"
    if name.lower().startswith("ddp") or name == "DDPStrategy":
        return "ddp"
    if name == "ModelParallelStrategy":
        tp = getattr(strat, "_tensor_parallel_size", 1)
        if tp not in (1, "auto"):
            raise ConfigError(key, f"tensor_parallel_size={tp}: {strategies.NOT_SUPPORTED}")
        return "fsdp"
    raise ConfigError(
        "trainer.strategy", f"{name!r} is not modelled; use ddp or ModelParallelStrategy (FSDP2)"
    )


def _precision(trainer_cfg: dict[str, Any]) -> str:
    value = trainer_cfg.get("precision")
    prec = "32-true" if value in (None, 32, "32") else str(value)
    if prec not in strategies.PRECISIONS:
        raise ConfigError(
            "trainer.precision", f"{prec!r} is not modelled; use one of {', '.join(strategies.PRECISIONS)}"
        )
    return prec


def _first_batch(model: LightningModule, data: LightningDataModule | None, batch_size: int | None) -> Any:
    owner: Any = data if data is not None else model
    if batch_size is not None:
        for obj in (data, model, getattr(model, "hparams", None)):
            if obj is not None and hasattr(obj, "batch_size"):
                obj.batch_size = batch_size
                break
        else:
            raise ConfigError(f"{GROUP}.batch_size", "neither the data module nor the model has `batch_size`")
    if data is not None:
        with contextlib.suppress(Exception):
            data.prepare_data()
        data.setup("fit")
    loader = owner.train_dataloader()
    batch = next(iter(loader))
    return _resize(batch, batch_size) if batch_size is not None else batch


def _resize(batch: Any, n: int) -> Any:
    """The batch with ``n`` rows (a short dataset gives fewer): rows repeat, shapes are what count."""
    from torch.utils._pytree import tree_map_only

    def grow(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] == n:
            return t
        return t[torch.arange(n) % t.shape[0]]

    return tree_map_only(torch.Tensor, grow, batch)


def _optimizer_of(model: nn.Module) -> torch.optim.Optimizer:
    opts = model.configure_optimizers()  # type: ignore[operator]
    while not isinstance(opts, torch.optim.Optimizer):
        if isinstance(opts, dict):
            opts = opts["optimizer"]
        elif isinstance(opts, (list, tuple)) and opts:
            opts = opts[0]
        else:
            raise ConfigError(
                "model.configure_optimizers",
                f"returned {engine.describe(opts)}, not an optimizer; estimate needs a torch.optim.Optimizer",
            )
    return opts


def _configure_model(model: nn.Module, mesh: Any) -> None:
    """``configure_model`` on the meta copy, with the device mesh ModelParallelStrategy gives it
    (``(data_parallel, tensor_parallel)``, set as ``model.device_mesh`` reads it)."""
    if mesh is not None:
        model._device_mesh = mesh
    configure = getattr(model, "configure_model", None)
    if callable(configure):
        configure()


def run_estimate(cli: Any) -> list[MemoryEstimate]:
    """The ``estimate`` subcommand: estimate, print the table, write ``memory_estimate.yaml``."""
    cfg_init = cli.config_init[GROUP]
    opts = cfg_init[GROUP]
    opts = opts if isinstance(opts, EstimateConfig) else EstimateConfig(**dict(opts))
    trainer_cfg = dict(cfg_init.get("trainer") or {})
    strategy = _strategy(trainer_cfg, opts.world_size)
    precision = _precision(trainer_cfg)
    memory = int(parse_size(opts.device_memory, f"{GROUP}.device_memory")) if opts.device_memory else None
    reserve = int(parse_size(opts.reserve, f"{GROUP}.reserve"))
    urls.check_dir(opts.save_dir or "", f"{GROUP}.save_dir")
    model, data = cli.model, cli.datamodule

    def one(bs: int | None) -> MemoryEstimate:
        batch = _first_batch(model, data, bs)
        fsdp = strategy == "fsdp"
        plan = EstimatePlan(
            optimizer_of_model=_optimizer_of,
            loss_fn=lambda m, b: engine.as_loss(m.training_step(b, 0)),  # type: ignore[operator]
            strategy=strategy,
            world_size=opts.world_size,
            precision=precision,
            device=opts.device,
            steps=opts.steps,
            fake=opts.fake,
            parallelize=_configure_model,
            mesh_shape=(opts.world_size, 1) if fsdp else None,
            mesh_dim_names=("data_parallel", "tensor_parallel") if fsdp else None,
            gpu=opts.gpu,
            torch_version=opts.torch_version,
            device_memory=memory,
        )
        est = estimate_plan(model, batch, plan)
        est.batch_size = bs if bs is not None else _rows(batch)
        return est

    if opts.batch_size == "auto":
        if memory is None:
            raise ConfigError(f"{GROUP}.batch_size", "`auto` needs `--estimate.device_memory` (e.g. 80GiB)")
        results = _largest_fitting(one, memory, reserve)
    else:
        sizes: list[int | None] = list(opts.batch_size) if opts.batch_size else [None]
        results = [one(bs) for bs in sizes]
    target = opts.save_dir or _memprofiler_save_dir(cfg_init) or "memprofiler"
    save_dir = remote.staged(target, Path(target).expanduser())
    path = write_estimates(save_dir, results, memory, reserve, auto=opts.batch_size == "auto")
    print(render_table(results, memory, reserve))
    print(f"written: {remote.publish(path, target, f'{GROUP}.save_dir')}")
    return results


def _rows(batch: Any) -> int | None:
    from torch.utils._pytree import tree_leaves

    for t in tree_leaves(batch):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return None


def _memprofiler_save_dir(cfg_init: Any) -> str | None:
    group = cfg_init.get("memprofiler")
    value = getattr(group, "save_dir", None) if group is not None else None
    if value is None and isinstance(group, dict):
        value = group.get("save_dir")
    return str(value) if value else None


def _largest_fitting(one: Any, memory: int, reserve: int) -> list[MemoryEstimate]:
    """The largest fitting batch in few estimates (:func:`memprofiler.estimate.batch_search.search`:
    two batches predict it, both its neighbours confirm it), every estimate made, by batch size."""
    found = batch_search.search(one, memory, reserve)
    return [found.tried[k] for k in sorted(found.tried)]
