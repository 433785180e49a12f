"""``MemProfilerCallback``: attach a :class:`MemProfiler` to a LightningModule."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from memprofiler import layout
from memprofiler.config import MemProfilerConfig
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
            self.profiler = MemProfiler(self.config, save_dir=save_dir, rank=trainer.global_rank)
        self.profiler.setup(pl_module)
        self.profiler.attach(pl_module)
        self.profiler.step_fn = lambda: trainer.global_step

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dump()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self.profiler is not None:
            self.profiler.record_crash(exception)
            # Lightning skips `teardown` after an exception: release hooks and threads here.
            self.profiler.teardown()
            MemProfiler.detach(pl_module)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.profiler is None:
            return
        self.profiler.teardown()
        MemProfiler.detach(pl_module)

    def _dump(self) -> None:
        if self.profiler is not None:
            self.profiler.dump()
