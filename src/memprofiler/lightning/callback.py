"""``MemProfilerCallback``: attach a :class:`MemProfiler` to a LightningModule."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from memprofiler import layout
from memprofiler._warn import warn_once
from memprofiler.config import MemProfilerConfig
from memprofiler.lightning.extended_profiler import ExtendedPyTorchProfiler
from memprofiler.lightning.metrics_logger import LoggerListener
from memprofiler.profiler import MemProfiler


def default_save_dir(trainer: pl.Trainer) -> Path:
    """``<trainer.log_dir or default_root_dir>/memprofiler``."""
    base = trainer.log_dir or trainer.default_root_dir
    return Path(base) / layout.DEFAULT_SUBDIR


class MemProfilerCallback(Callback):
    """Profiles the LightningModule's ``@memprofilable`` methods during fit, validate and test.

    Files go to ``config.save_dir`` (default ``<trainer.log_dir>/memprofiler``), one set per
    global rank. They are written at fit end, on an exception (including SIGTERM, which
    Lightning turns into one) and at teardown, atomically each time.

    Args:
        config: a :class:`~memprofiler.MemProfilerConfig` or a mapping of its fields.

    Raises:
        ConfigError: on a bad config, when the callback is built.
        ArtifactError: at ``setup`` when the output directory is not writable.

    Example:
        >>> trainer = Trainer(callbacks=[MemProfilerCallback({"schedule": {"active": 2}})])  # doctest: +SKIP
    """

    def __init__(self, config: MemProfilerConfig | Mapping[str, Any] | None = None) -> None:
        self.config = MemProfilerConfig.from_any(config)
        self.profiler: MemProfiler | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(save_dir=self.config.save_dir)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self.config.enabled:
            return
        if self.profiler is None:
            save_dir = self.config.save_dir or os.fspath(default_save_dir(trainer))
            config = _follow_profiler_schedule(self.config, trainer)
            self.profiler = MemProfiler(config, save_dir=save_dir, rank=trainer.global_rank)
            self.profiler.setup(pl_module)
            if config.log_metrics:
                self.profiler.add_listener(LoggerListener(trainer))
            extended = _extended_profiler(trainer)
            if extended is not None and self.profiler.timeline is not None:
                extended.add_memory_timeline(self.profiler.timeline)
        self.profiler.setup(pl_module)
        self.profiler.attach(pl_module)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dump()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._dump()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.profiler is None:
            return
        self.profiler.teardown()
        MemProfiler.detach(pl_module)

    def _dump(self) -> None:
        if self.profiler is not None:
            self.profiler.dump()


def _follow_profiler_schedule(config: MemProfilerConfig, trainer: pl.Trainer) -> MemProfilerConfig:
    """With ``schedule.follow_profiler``, a copy of ``config`` on the profiler's schedule."""
    if not config.schedule.follow_profiler:
        return config
    profiler = _extended_profiler(trainer)
    if profiler is None:
        warn_once(
            "`schedule.follow_profiler` is on but `trainer.profiler` is not "
            "`memprofiler.ExtendedPyTorchProfiler`; using the memprofiler schedule as given"
        )
        return config
    schedule = dataclasses.replace(profiler.schedule_cfg, follow_profiler=True)
    return dataclasses.replace(config, schedule=schedule)


def _extended_profiler(trainer: pl.Trainer) -> ExtendedPyTorchProfiler | None:
    profiler = trainer.profiler  # type: ignore[attr-defined]  # set by Lightning's connector
    return profiler if isinstance(profiler, ExtendedPyTorchProfiler) else None
