"""Every use of Lightning's private API, in one place, each pinned by ``tests/lightning/test_compat.py``.

Lightning has no public hook for a subcommand of our own (``estimate``), for Trainer callbacks
added by a config group, for a model instantiator of our own (the meta device), or for a profiler
run that recorded nothing. The code here calls private names for those, and the overrides in
``cli.py``, ``estimate.py``, ``extended_profiler.py`` and ``profiler_schedule.py`` replace private
methods. :data:`PINNED` lists each name with the parameters relied on and
:data:`PINNED_ATTRIBUTES` the private attributes read or written; the test fails on a Lightning
release that renames or re-signs any of them. The names Lightning gives its profiler actions
(a callback's hook, the wait for a batch) and its trace annotations are private too: they are
here, and the test runs a Trainer to check them. The range tested is ``lightning`` in
``pyproject.toml``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # lightning.pytorch.cli pulls in jsonargparse: only the CLI needs it at run time
    from lightning.pytorch.cli import LightningArgumentParser

#: Private functions and methods used, by dotted path, with the parameter names relied on.
PINNED: dict[str, tuple[str, ...]] = {
    # Overridden (cli.py, estimate.py, extended_profiler.py, profiler_schedule.py).
    "lightning.pytorch.cli.LightningCLI._add_subcommands": ("self", "parser", "kwargs"),
    "lightning.pytorch.cli.LightningCLI._add_instantiators": ("self",),
    "lightning.pytorch.cli.LightningCLI._run_subcommand": ("self", "subcommand"),
    "lightning.pytorch.cli.LightningCLI._instantiate_trainer": ("self", "config", "callbacks"),
    "lightning.pytorch.profilers.pytorch.PyTorchProfiler._cache_functions_events": ("self",),
    # Public, but CyclicSchedule repeats its body over the private attributes below.
    "lightning.pytorch.profilers.pytorch.ScheduleWrapper.__call__": ("self", "num_step"),
    # Called (here, and extended_profiler.py / profiler_schedule.py on their own base class).
    "lightning.pytorch.cli.LightningCLI._prepare_subcommand_parser": (
        "self",
        "klass",
        "subcommand",
        "kwargs",
    ),
    "lightning.pytorch.cli.LightningCLI._add_arguments": ("self", "parser"),
    "lightning.pytorch.cli.LightningCLI._parser": ("self", "subcommand"),
    "lightning.pytorch.cli.LightningCLI._get": ("self", "config", "key", "default"),
    "lightning.pytorch.cli._InstantiatorFn.__init__": ("self", "cli", "key"),
    "lightning.pytorch.cli._InstantiatorFn.__call__": (
        "self",
        "class_type",
        "args",
        "applied_instantiation_links",
        "kwargs",
    ),
    "lightning.pytorch.cli._get_module_type": ("value",),
    "lightning.pytorch.cli._get_short_description": ("component",),
    "lightning.pytorch.profilers.pytorch.PyTorchProfiler._delete_profilers": ("self",),
    "lightning.pytorch.profilers.profiler.Profiler._stats_to_str": ("self", "stats"),
    "lightning.pytorch.profilers.pytorch.ScheduleWrapper._step": ("self",),
    "lightning.pytorch.callbacks.callback.Callback._generate_state_key": ("self", "kwargs"),
}

#: Private instance attributes read or written, by the dotted path of the class that sets them.
PINNED_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "lightning.pytorch.cli.LightningCLI": (
        "_subcommand_parsers",
        "_subcommand_method_arguments",
        "_model_class",
    ),
    "lightning.pytorch.profilers.pytorch.PyTorchProfiler": (
        "_profiler_kwargs",
        "_lightning_module",
        "_export_to_chrome",
        "_stage",
        "_register",
        "_schedule",
        "_group_by_input_shapes",
        "_sort_by_key",
        "_row_limit",
        "_table_kwargs",
    ),
    "lightning.pytorch.core.module.LightningModule": ("_trainer",),
    "lightning.pytorch.profilers.pytorch.ScheduleWrapper": (
        "_schedule",
        "_current_action",
        "_prev_schedule_action",
        "num_step",
    ),
}

#: The profiler actions around the wait for the next batch, by the loops' own names:
#: ``[_TrainingEpochLoop].train_dataloader_next``, ``[_EvaluationLoop].val_next`` (validation and
#: the sanity check), ``.test_next``, ``[_PredictionLoop].predict_next``.
TRAIN_DATALOADER_WAIT = "[_TrainingEpochLoop].train_dataloader_next"
_DATALOADER_WAIT_ENDINGS = ("].train_dataloader_next", "].val_next", "].test_next", "].predict_next")
#: Prefixes of the ``record_function`` annotations Lightning's ``PyTorchProfiler`` puts in a
#: trace: each profiler action (``[pl][profile]`` + action) and each module's forward
#: (``[pl][module]`` + ``module type: name``). ``memprofiler.analysis`` reads traces without
#: Lightning: the test checks its copies equal these.
TRACE_ACTION_PREFIX = "[pl][profile]"
TRACE_MODULE_PREFIX = "[pl][module]"


def callback_action_prefix(state_key: str) -> str:
    """How the profiler actions of a callback's hooks begin: ``[Callback]{state_key}.``."""
    return f"[Callback]{state_key}."


def is_dataloader_wait(action_name: str) -> bool:
    """Whether a profiler action is a loop's wait for its next batch (train, val, test, predict)."""
    return action_name.startswith("[") and action_name.endswith(_DATALOADER_WAIT_ENDINGS)


def short_description(component: object) -> str | None:
    """The first line of ``component``'s docstring, as Lightning words a subcommand's help."""
    from lightning.pytorch.cli import _get_short_description

    return _get_short_description(component)


def prepare_subcommand_parser(cli: Any, klass: type, name: str, **kwargs: Any) -> LightningArgumentParser:
    """The parser Lightning builds for the Trainer method ``name`` (``fit``, ``validate``, ...)."""
    return cli._prepare_subcommand_parser(klass, name, **kwargs)


def add_arguments(cli: Any, parser: LightningArgumentParser) -> None:
    """Add the CLI's trainer, model, data, optimizer and user arguments to ``parser``."""
    cli._add_arguments(parser)


def start_subcommands(cli: Any) -> None:
    """Reset the CLI's table of subcommand parsers, as Lightning's ``_add_subcommands`` does."""
    cli._subcommand_parsers = {}


def register_subcommand(
    cli: Any, name: str, parser: LightningArgumentParser, method_arguments: dict[str, Any] | None = None
) -> None:
    """Record ``parser`` as subcommand ``name``'s (``method_arguments`` for one that is no Trainer method)."""
    cli._subcommand_parsers[name] = parser
    if method_arguments is not None:
        cli._subcommand_method_arguments[name] = method_arguments


def subcommand_parser(cli: Any, name: str | None) -> LightningArgumentParser:
    """The parser of subcommand ``name`` (the main parser for ``None``)."""
    return cli._parser(name)


def config_value(cli: Any, config: Any, key: str) -> Any:
    """``config[key]`` of the current subcommand, as Lightning reads its own keys."""
    return cli._get(config, key)


def state_key(callback: Any, **kwargs: Any) -> str:
    """The callback's checkpoint state key, made of its class name and ``kwargs`` as Lightning makes them."""
    return callback._generate_state_key(**kwargs)


def attached_trainer(module: Any) -> Any:
    """The Trainer ``module`` is attached to, or ``None`` (the public ``trainer`` raises then)."""
    return getattr(module, "_trainer", None)


def model_instantiator(cli: Any, wrap: Callable[[Any], Any]) -> tuple[Any, type]:
    """Lightning's model instantiator wrapped by ``wrap``, and the model type it is for."""
    from lightning.pytorch.cli import _get_module_type, _InstantiatorFn

    return wrap(_InstantiatorFn(cli=cli, key="model")), _get_module_type(cli._model_class)
