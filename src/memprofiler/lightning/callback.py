"""``MemProfilerCallback``: attach a :class:`MemProfiler` to a LightningModule."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import Strategy
from typing_extensions import override

from memprofiler import layout
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.config import MemProfilerConfig, urls
from memprofiler.core.method_wrap import Owner
from memprofiler.core.profiler import MemProfiler
from memprofiler.errors import ArtifactError, ConfigError, MemProfilerWarning
from memprofiler.lightning import _compat as compat
from memprofiler.lightning.extended_profiler import ExtendedPyTorchProfiler
from memprofiler.lightning.metrics_logger import LoggerListener
from memprofiler.output.remote import is_url
from memprofiler.user_line import warn_at_user


def default_save_dir(trainer: pl.Trainer) -> Path | str:
    """``<trainer.log_dir or default_root_dir>/memprofiler``; a URL when that is remote (``s3://...``),
    as Lightning's loggers follow a remote ``default_root_dir``."""
    base = trainer.log_dir or trainer.default_root_dir
    urls.check_dir(base, "trainer.default_root_dir")
    if is_url(base):
        return f"{str(base).rstrip('/')}/{layout.DEFAULT_SUBDIR}"
    return Path(base) / layout.DEFAULT_SUBDIR


class MemProfilerCallback(Callback):
    """Profiles the LightningModule's methods named in ``collect_funcs`` during fit, validate and test.

    A named method of the LightningModule, the DataModule or the strategy is collected as if it
    carried ``@memprofilable``: it is wrapped at ``setup`` and unwrapped at teardown (also after
    an exception), so a model you cannot edit is profiled from the config alone. A name none of
    them has is one warning at ``setup``.

    Files go to ``config.save_dir`` (default ``<trainer.log_dir>/memprofiler``), one set per
    global rank. They are written at fit end, on an exception (including SIGTERM, which
    Lightning turns into one) and at teardown, atomically each time.

    Args:
        config: a :class:`~memprofiler.MemProfilerConfig` or a mapping of its fields.
        cuda: the CUDA seam of the profiler it builds (tests pass a fake); the real one by default.

    Raises:
        ConfigError: on a bad config, when the callback is built.
        ArtifactError: at ``setup`` when the output directory is not writable.

    Example:
        >>> trainer = Trainer(callbacks=[MemProfilerCallback({"schedule": {"active": 2}})])  # doctest: +SKIP
    """

    def __init__(
        self, config: MemProfilerConfig | Mapping[str, Any] | None = None, *, cuda: CudaBackend | None = None
    ) -> None:
        self.config = MemProfilerConfig.from_any(config)
        self._cuda = cuda
        #: Where this callback came from, for the message that refuses a second profiler.
        #: ``MemProfilerCLI`` and ``ProfilerHooksMixin`` set their own.
        self.origin = "a `MemProfilerCallback` in `trainer.callbacks`"
        self.profiler: MemProfiler | None = None
        self._bound = False
        self._trainer_ref: weakref.ref[pl.Trainer] | None = None

    @property
    def state_key(self) -> str:
        return compat.state_key(self, save_dir=self.config.save_dir)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self.config.enabled:
            return
        refuse_second_profiler(trainer.callbacks, self)  # type: ignore[attr-defined]
        if self.profiler is not None and self._trainer_ref is not None and self._trainer_ref() is not trainer:
            # The same callback in a new Trainer: a fresh profiler (counts, save_dir, loggers).
            self.profiler.teardown()
            self.profiler = None
        self._trainer_ref = weakref.ref(trainer)
        if self.profiler is None:
            config = _follow_profiler_schedule(self.config, trainer)
            self.profiler = MemProfiler(
                config,
                default_save_dir=default_save_dir(trainer),
                rank=trainer.global_rank,
                cuda=self._cuda,
                module=pl_module,
                step_fn=lambda: trainer.global_step,
                # Every rank runs the Trainer's teardown together: the summary may use collectives.
                summary_collective=True,
                listeners=[LoggerListener(trainer)] if config.log_metrics else [],
            )
            try:
                self.profiler.setup()
            except ArtifactError as err:
                raise _name_default_root_dir(err, config) from None
            extended = _extended_profiler(trainer)
            if extended is not None:
                # One save_dir for everything: the traces go to this run's directory (and store).
                extended.use_run_dir(self.profiler.save_dir, self.profiler.mirror, self.profiler.run_id)
                if self.profiler.timeline is not None:
                    extended.add_memory_timeline(self.profiler.timeline)
                if trainer.is_global_zero and (cost := _tracker_under_stack_cost(config, extended)):
                    warn_at_user(cost, MemProfilerWarning)
        else:
            # A later stage (validate, test) of the same Trainer; it binds its module at its
            # start hook.
            self.profiler.setup()
        self.profiler.attach(pl_module)
        # `collect_funcs` names methods of these, collected with no `@memprofilable` in their code
        # (Lightning's BoringModel, a Hugging Face model in a LightningModule): wrapped until teardown.
        self.profiler.wrap_methods(_owners(trainer, pl_module))

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._bind(trainer, pl_module)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._bind(trainer, pl_module)

    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._bind(trainer, pl_module)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._bind(trainer, pl_module)

    # Under automatic optimization, backward and the optimizer step run after training_step
    # returns; the batch-end hooks are where a step-long collection window closes.
    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_end()

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._step_end()

    @override
    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._step_end()

    @override
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._step_end()

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dump()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self.profiler is not None:
            self.profiler.record_crash(exception)  # also the cross-rank summary, bounded wait
            # Lightning skips `teardown` after an exception: release hooks and threads here.
            self.profiler.teardown()
            MemProfiler.detach(pl_module)
            self._bound = False

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.profiler is None:
            return
        self.profiler.teardown()
        MemProfiler.detach(pl_module)
        self._bound = False

    def _dump(self) -> None:
        if self.profiler is not None:
            self.profiler.dump()

    def _bind(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After configure_model and the strategy's set-up: the model is sharded (fully_shard)
        # and every optimizer exists. A bad FSDP root raises ConfigError here.
        if self.profiler is not None and not self._bound:
            self.profiler.bind(pl_module, list(trainer.optimizers))
            self._bound = True

    def _step_end(self) -> None:
        if self.profiler is not None:
            self.profiler.step_end()


def _owners(trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[Owner]:
    """Where a name in ``collect_funcs`` is looked up, in this order: a method of the
    LightningModule first (``training_step`` is the strategy's too: the module's is the one meant),
    but an owner's own method before a default hook another inherits from its base."""
    owners = [Owner("the LightningModule", pl_module, pl.LightningModule)]
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None:
        owners.append(Owner("the DataModule", datamodule, pl.LightningDataModule))
    owners.append(Owner("the strategy", trainer.strategy, Strategy))
    return owners


def _name_default_root_dir(err: ArtifactError, config: MemProfilerConfig) -> ArtifactError:
    """``err`` about the default ``save_dir``, saying it comes from ``trainer.default_root_dir``."""
    text = str(err)
    if config.save_dir or not text.startswith("`save_dir`"):
        return err
    return ArtifactError(
        "`save_dir` (unset: under `trainer.default_root_dir`)"
        + text[len("`save_dir`") :]
        + "; or set `save_dir`"
    )


def refuse_second_profiler(callbacks: list[Callback], own: MemProfilerCallback | None) -> None:
    """Refuse a Trainer on which two enabled memprofiler callbacks would profile one module.

    Both would count the same ``@memprofilable`` calls, only the last attached one would collect
    them, and both write the same file names: one run's data would be lost without a word.

    Args:
        callbacks: the Trainer's callbacks.
        own: the callback asking (it may be one of the two), or ``None``.

    Raises:
        ConfigError: naming where both profilers come from and the fix.
    """
    enabled = [cb for cb in callbacks if isinstance(cb, MemProfilerCallback) and cb.config.enabled]
    if own is not None and own not in enabled:
        enabled.insert(0, own)
    if len(enabled) > 1:
        first, second = enabled[0], enabled[1]
        raise ConfigError("", two_profilers_message(first.origin, second.origin))


def two_profilers_message(first: str, second: str) -> str:
    """One line saying that two profilers were configured and how to keep one."""
    return (
        f"two memprofiler profilers on one Trainer: {first} and {second}; only one would collect "
        "and both write the same files. Keep one of them (remove the other, or give it `enabled: false`)"
    )


def _follow_profiler_schedule(config: MemProfilerConfig, trainer: pl.Trainer) -> MemProfilerConfig:
    """With ``schedule.follow_profiler``, a copy of ``config`` on the profiler's schedule."""
    if not config.schedule.follow_profiler:
        return config
    profiler = _extended_profiler(trainer)
    if profiler is None:
        if trainer.is_global_zero:
            warn_at_user(
                "memprofiler: `schedule.follow_profiler` is on but `trainer.profiler` is not "
                "`memprofiler.ExtendedPyTorchProfiler`; using the memprofiler schedule as given",
                MemProfilerWarning,
            )
        return config
    schedule = dataclasses.replace(profiler.schedule_cfg, follow_profiler=True)
    return dataclasses.replace(config, schedule=schedule)


def _tracker_under_stack_cost(config: MemProfilerConfig, profiler: ExtendedPyTorchProfiler) -> str:
    """What a module tracker costs under the profiler's Python tracer, or ``""`` when they are
    not combined."""
    key = "track_module_mem" if config.track_module_mem else "track_fsdp_mem" if config.track_fsdp_mem else ""
    if not key or not profiler.records_python_calls:
        return ""
    # Measured on CPU, one step of a 2-layer GPT (examples/demo.py, d_model 64), torch 2.13.
    return (
        f"memprofiler: `{key}` with ExtendedPyTorchProfiler(with_stack=True): in the steps both "
        "record, the profiler records every Python call of the module tracker's dispatch: about "
        "20x the CPU time of a step profiled alone and a trace about 30x bigger (measured: 58 ms "
        "-> 1.15 s, 1.5 MB -> 50 MB). The summary table and `memprofiler report` leave the "
        "tracker's work out. With `with_stack: false` its calls are not recorded (121 ms, 1.6 MB), "
        "at the cost of memory by category"
    )


def _extended_profiler(trainer: pl.Trainer) -> ExtendedPyTorchProfiler | None:
    profiler = trainer.profiler  # type: ignore[attr-defined]  # set by Lightning's connector
    return profiler if isinstance(profiler, ExtendedPyTorchProfiler) else None
