"""The argument parser of ``MemProfilerCLI`` and its checks: one line per mistake, exit code 2.

jsonargparse reports a bad ``--config`` file as ``<unicode string>`` and an unknown key of the
``memprofiler:`` group without the allowed keys; a bad value inside a callback's
``init_args.config`` or a model's ``memprofiler_cfg`` only surfaces as a long traceback when the
classes are built. The parser here rewrites the first two; :func:`check_profiler_entries` finds
the others (and a second profiler) before anything is built.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, NoReturn

import yaml
from lightning.pytorch.cli import LightningArgumentParser
from typing_extensions import override

from memprofiler.config import MemProfilerConfig
from memprofiler.config._build import build_dataclass
from memprofiler.config.keys import check_path
from memprofiler.config.timeline import TimelineConfig
from memprofiler.config.trace_files import TraceFilesConfig
from memprofiler.errors import ConfigError
from memprofiler.lightning import cli_messages
from memprofiler.lightning.callback import MemProfilerCallback, two_profilers_message
from memprofiler.lightning.extended_profiler import ExtendedPyTorchProfiler

GROUP = "memprofiler"

_config_path: ContextVar[str | None] = ContextVar("memprofiler_config_path", default=None)
_UNKNOWN_OPTION = re.compile(r"does not accept option '([^']+)'")
_UNRECOGNIZED = re.compile(r"--((?:[\w-]+\.)*" + GROUP + r"\.[\w.]+)")


class MemProfilerArgumentParser(LightningArgumentParser):
    """A ``LightningArgumentParser`` whose memprofiler errors are one line naming the key or file."""

    @override
    def parse_path(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        token = _config_path.set(str(path))
        try:
            return super().parse_path(path, *args, **kwargs)
        except Exception as err:  # a sub-parser raises instead of exiting: rename the file there
            better = _yaml_file_message(err, str(path))
            if better is None:
                raise
            raise type(err)(better) from err
        finally:
            _config_path.reset(token)

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        better = rewrite_message(message, ex)
        if better is None:
            super().error(message, ex)
        self.fail(better)

    def fail(self, message: str) -> NoReturn:
        """Print ``error: message`` as one line and exit with code 2 (or raise, as configured)."""
        if not self.exit_on_error:
            super().error(message)
        self._logger.error(message)
        sys.stderr.write(f"error: {message}\n")
        self.exit(2)


def rewrite_message(message: str, ex: BaseException | None) -> str | None:
    """The one-line memprofiler version of a jsonargparse error, or ``None`` to keep it."""
    path = _config_path.get()
    if path is not None:
        better = _yaml_file_message(ex, path)
        if better is not None:
            return better
    better = cli_messages.better_message(message)
    if better is not None:
        return better
    if "Problems parsing config" in message and "<unicode string>" in message:
        return " ".join(message.replace('"<unicode string>"', "the config").split())
    for pattern in (_UNKNOWN_OPTION, _UNRECOGNIZED):
        match = pattern.search(message)
        if match is None:
            continue
        parts = match.group(1).split(".")
        if GROUP not in parts:
            continue
        at = parts.index(GROUP)
        err = check_path(MemProfilerConfig, parts[at + 1 :], ".".join(parts[: at + 1]))
        if err is not None:
            return str(err)
    return None


def _yaml_file_message(ex: BaseException | None, path: str) -> str | None:
    """Name the file and line of a YAML syntax error found in a ``--config`` file."""
    seen: set[int] = set()
    while ex is not None and id(ex) not in seen:
        seen.add(id(ex))
        if isinstance(ex, yaml.MarkedYAMLError):
            mark = ex.problem_mark or ex.context_mark
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = " ".join(str(p) for p in (ex.context, ex.problem) if p)
            return f"cannot parse config file {path!r}{where}: {what}; fix the YAML syntax there"
        ex = ex.__cause__ or ex.__context__
    return None


def check_profiler_entries(cfg: Any, use_group: bool = True) -> ConfigError | None:
    """Validate every memprofiler config in a parsed (not yet built) LightningCLI config.

    Looks at the ``memprofiler:`` group (unless ``use_group`` is false), each
    ``trainer.callbacks`` entry whose class is a :class:`MemProfilerCallback`, and the model's
    ``memprofiler_cfg``. Returns the first error, with its full dotted key, or one for a second
    enabled profiler; ``None`` when all is well.
    """
    problem = check_extended_profiler(cfg)
    if problem is not None:
        return problem
    enabled: list[str] = []
    for key, value, origin in _entries(cfg, use_group):
        try:
            built = MemProfilerConfig.from_any(_to_dict(value))
        except ConfigError as err:
            return err.prefixed(key)
        if built.enabled:
            enabled.append(origin)
    if len(enabled) > 1:
        return ConfigError("", two_profilers_message(enabled[0], enabled[1]))
    return None


def check_extended_profiler(cfg: Any) -> ConfigError | None:
    """The first bad ``trace_files`` / ``timeline`` field of an ``ExtendedPyTorchProfiler`` in
    ``trainer.profiler`` (an unknown template field, say), with its full dotted key."""
    profiler = _get(cfg, "trainer.profiler")
    if not _is_subclass(_get(profiler, "class_path"), ExtendedPyTorchProfiler):
        return None
    for name, cls in (("trace_files", TraceFilesConfig), ("timeline", TimelineConfig)):
        value = _get(profiler, f"init_args.{name}")
        if value is None:
            continue
        try:
            build_dataclass(cls, _to_dict(value), f"trainer.profiler.init_args.{name}")
        except ConfigError as err:
            return err
    return None


def group_is_used(cfg: Any, default: Any) -> bool:
    """Whether the ``memprofiler:`` group installs a profiler.

    The group always has a value (its defaults) whether written or not. Left at its defaults
    while a callback entry or a model's ``memprofiler_cfg`` configures profiling, it is taken as
    not written, so that profiler is the only one.
    """
    value = _get(cfg, GROUP)
    if value is None:
        return False
    if _to_dict(value) != _to_dict(default):
        return True
    return next(_entries(cfg, use_group=False), None) is None


def _entries(cfg: Any, use_group: bool) -> Iterator[tuple[str, Any, str]]:
    """(dotted key, raw value, origin) of each memprofiler config in ``cfg``."""
    group = _get(cfg, GROUP) if use_group else None
    if group is not None:
        yield GROUP, group, "the `memprofiler:` group of `MemProfilerCLI`"
    callbacks = _get(cfg, "trainer.callbacks")
    if callbacks is not None and not isinstance(callbacks, list):
        callbacks = [callbacks]
    for i, entry in enumerate(callbacks or []):
        if _is_profiler_callback(_get(entry, "class_path")):
            key = f"trainer.callbacks[{i}].init_args.config"
            value = _get(entry, "init_args.config")
            yield key, value, f"`trainer.callbacks[{i}]` ({_get(entry, 'class_path')})"
    model = _get(cfg, "model")
    for key in ("memprofiler_cfg", "init_args.memprofiler_cfg"):
        value = _get(model, key)
        if value is not None:
            yield f"model.{key}", value, f"`model.{key}` (`ProfilerHooksMixin`)"


def _is_profiler_callback(class_path: Any) -> bool:
    return _is_subclass(class_path, MemProfilerCallback)


def _is_subclass(class_path: Any, base: type) -> bool:
    if not isinstance(class_path, str):
        return False
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(sys.modules.get(module_name) or __import__(module_name, fromlist=[name]), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, base)


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if obj is None:
            return None
        try:
            obj = obj.get(part) if hasattr(obj, "get") else getattr(obj, part, None)
        except (KeyError, TypeError):
            return None
    return obj


def _to_dict(value: Any) -> Any:
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value
