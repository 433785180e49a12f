"""``MemProfilerCLI``: a LightningCLI with a top-level ``memprofiler:`` config group.

.. code-block:: yaml

    memprofiler:
      schedule: {warmup: 1, active: 2}
      collect_funcs: {default: [training_step, validation_step]}

A wrong key or value in the group, in a ``MemProfilerCallback`` entry of ``trainer.callbacks``
or in the model's ``memprofiler_cfg``, a second profiler, and a YAML syntax error in a
``--config`` file are each reported as one line naming the dotted key or the file, with exit
code 2, before any model or trainer is built.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from memprofiler.config import MemProfilerConfig
from memprofiler.errors import MemProfilerError
from memprofiler.lightning import _compat as compat
from memprofiler.lightning import advise
from memprofiler.lightning.callback import MemProfilerCallback
from memprofiler.lightning.cli_checks import check_save_dirs
from memprofiler.lightning.cli_parser import (
    GROUP,
    MemProfilerArgumentParser,
    check_profiler_entries,
    group_is_used,
)
from memprofiler.lightning.estimate import EstimateSubcommand


class MemProfilerCLI(EstimateSubcommand, LightningCLI):
    """LightningCLI that adds ``memprofiler:`` and installs a :class:`MemProfilerCallback`.

    The group holds the fields of :class:`~memprofiler.MemProfilerConfig`. With ``enabled:
    false``, or left at its defaults while a ``MemProfilerCallback`` entry of
    ``trainer.callbacks`` or the model's ``memprofiler_cfg`` configures profiling, it adds no
    callback. The ``estimate`` subcommand estimates one rank's
    peak memory of the same config (see :mod:`memprofiler.lightning.estimate`); ``advise`` ranks the
    changes that make it fit a budget (:mod:`memprofiler.lightning.advise`).
    """

    META_SUBCOMMANDS = {
        **EstimateSubcommand.META_SUBCOMMANDS,
        advise.GROUP: (advise.AdviseConfig, advise.run_advise, advise.HELP),
    }

    @override
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        if self.parser_class is LightningArgumentParser:
            self.parser_class = MemProfilerArgumentParser
        return super().init_parser(**kwargs)

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_class_arguments(MemProfilerConfig, GROUP)

    @override
    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()
        cfg = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        parser = compat.subcommand_parser(self, self.subcommand)
        fail = getattr(parser, "fail", parser.error)
        self._use_group = group_is_used(cfg, parser.get_defaults().get(GROUP))
        problem = check_profiler_entries(cfg, self._use_group)
        if problem is not None:
            fail(str(problem))
            return
        problem_dir = check_save_dirs(cfg, self._use_group)
        if problem_dir is not None:
            fail(problem_dir)

    @override
    def _run_subcommand(self, subcommand: str) -> None:
        # A user's mistake found once the classes exist (an FSDP root module that is not there,
        # a store that refuses us mid-set-up): one line and exit code 2, not a traceback.
        try:
            super()._run_subcommand(subcommand)
        except MemProfilerError as err:
            parser = compat.subcommand_parser(self, subcommand)
            getattr(parser, "fail", parser.error)(" ".join(str(err).split()))

    @override
    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        value = compat.config_value(self, self.config_init, GROUP)
        if value is not None and getattr(self, "_use_group", True):
            cfg = MemProfilerConfig.from_any(
                _to_dict(value) if not isinstance(value, MemProfilerConfig) else value
            )
            if cfg.enabled:
                own = MemProfilerCallback(cfg)
                own.origin = "the `memprofiler:` group of `MemProfilerCLI`"
                callbacks = [*callbacks, own]
        return super()._instantiate_trainer(config, callbacks)


def _to_dict(value: Any) -> Any:
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value
