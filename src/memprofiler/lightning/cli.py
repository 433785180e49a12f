"""``MemProfilerCLI``: a LightningCLI with a top-level ``memprofiler:`` config group.

.. code-block:: yaml

    memprofiler:
      schedule: {warmup: 1, active: 2}
      collect_funcs: {default: [training_step, validation_step]}

A wrong key or value in the group is reported by jsonargparse, naming the key, with exit
code 2, before any model or trainer is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from memprofiler.config import MemProfilerConfig
from memprofiler.core.profiler import check_writable
from memprofiler.errors import ArtifactError, ConfigError
from memprofiler.lightning.callback import MemProfilerCallback
from memprofiler.lightning.estimate import EstimateSubcommand

GROUP = "memprofiler"


class MemProfilerCLI(EstimateSubcommand, LightningCLI):
    """LightningCLI that adds ``memprofiler:`` and installs a :class:`MemProfilerCallback`.

    The group holds the fields of :class:`~memprofiler.MemProfilerConfig`. When absent or
    ``enabled: false`` no callback is added. The ``estimate`` subcommand estimates one rank's
    peak memory of the same config (see :mod:`memprofiler.lightning.estimate`).
    """

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_dataclass_arguments(MemProfilerConfig, GROUP)

    @override
    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()
        cfg = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        value = cfg.get(GROUP)
        if value is None:
            return
        try:
            cfg = MemProfilerConfig.from_any(_to_dict(value))
        except ConfigError as err:
            self._parser(self.subcommand).error(str(err.prefixed(GROUP)))
            return
        if cfg.enabled and cfg.save_dir:
            try:
                check_writable(Path(cfg.save_dir).expanduser())
            except ArtifactError as err:
                self._parser(self.subcommand).error(str(err).replace("`save_dir`", f"`{GROUP}.save_dir`", 1))

    @override
    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        value = self._get(self.config_init, GROUP)
        if value is not None:
            cfg = MemProfilerConfig.from_any(
                _to_dict(value) if not isinstance(value, MemProfilerConfig) else value
            )
            if cfg.enabled:
                callbacks = [*callbacks, MemProfilerCallback(cfg)]
        return super()._instantiate_trainer(config, callbacks)


def _to_dict(value: Any) -> Any:
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value
