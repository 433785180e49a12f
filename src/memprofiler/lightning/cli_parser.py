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

from memprofiler.config import CollectFuncsConfig, MemProfilerConfig
from memprofiler.config._build import build_dataclass
from memprofiler.config.keys import check_path, renamed
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
    def parse_string(self, *args: Any, **kwargs: Any) -> Any:
        # Renamed keys of the `memprofiler:` group (the ancestor's `fsdp_mem_track_module_depth`,
        # `collect_funcs.fsdp`...) are read under their new names with a deprecation warning,
        # as from a dict: jsonargparse alone knows only the current fields.
        if "content" in kwargs:
            kwargs["content"] = read_renamed_keys(kwargs["content"])
        elif args:
            args = (read_renamed_keys(args[0]), *args[1:])
        return super().parse_string(*args, **kwargs)

    @override
    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        if args is not None:
            args = [_renamed_option(a) if isinstance(a, str) else a for a in args]
        return super().parse_args(args, *rest, **kwargs)

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # Every error is one line and exit code 2: never the usage (over 100 lines) before it.
        better = rewrite_message(message, ex)
        self.fail(better if better is not None else cli_messages.one_line(message))

    def fail(self, message: str) -> NoReturn:
        """Print ``error: message`` as one line and exit with code 2 (or raise, as configured)."""
        if not self.exit_on_error:
            super().error(message)
        self._logger.error(message)
        sys.stderr.write(f"error: {message}\n")
        self.exit(2)


def read_renamed_keys(content: Any) -> Any:
    """A config text whose ``memprofiler:`` group uses renamed keys, with the new names (a
    ``FutureWarning`` naming both for each); any other text as it is."""
    if not isinstance(content, str) or GROUP not in content:
        return content
    try:
        data = yaml.safe_load(content)
    except yaml.YAMLError:
        return content  # jsonargparse reports it, with the file
    if not isinstance(data, dict):
        return content
    changed = False
    try:
        for holder in _groups(data):
            changed |= _rename_in(holder, MemProfilerConfig, GROUP)
    except ConfigError:
        return content  # an old key beside its new name: jsonargparse refuses the old one
    return yaml.safe_dump(data, sort_keys=False) if changed else content


def _groups(data: dict[Any, Any]) -> Iterator[dict[Any, Any]]:
    """The ``memprofiler:`` group mappings of a config: at the top, or under a subcommand."""
    for holder in (data, *(v for v in data.values() if isinstance(v, dict))):
        group = holder.get(GROUP)
        if isinstance(group, dict):
            yield group


def _rename_in(mapping: dict[Any, Any], cls: type, prefix: str) -> bool:
    changed = False
    for name in list(mapping):
        key = f"{prefix}.{name}"
        new = renamed(cls, str(name), key, mapping) if isinstance(name, str) else name
        if new != name:
            mapping[new] = mapping.pop(name)
            changed = True
    funcs = mapping.get("collect_funcs")
    if isinstance(funcs, dict):
        changed |= _rename_in(funcs, CollectFuncsConfig, f"{prefix}.collect_funcs")
    return changed


def _renamed_option(arg: str) -> str:
    """``--memprofiler.<old key>[=value]`` as ``--memprofiler.<new key>``, with the warning."""
    if not arg.startswith(f"--{GROUP}."):
        return arg
    option, eq, value = arg.partition("=")
    parts = option[2:].split(".")
    cls: type = MemProfilerConfig
    if len(parts) == 3 and parts[1] == "collect_funcs":
        cls = CollectFuncsConfig
    elif len(parts) != 2:
        return arg
    new = renamed(cls, parts[-1], ".".join(parts), ())
    return arg if new == parts[-1] else "--" + ".".join([*parts[:-1], new]) + eq + value


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
    for key, value, origin in config_entries(cfg, use_group):
        try:
            built = MemProfilerConfig.from_any(to_dict(value))
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
    profiler = get_dotted(cfg, "trainer.profiler")
    if not _is_subclass(get_dotted(profiler, "class_path"), ExtendedPyTorchProfiler):
        return None
    for name, cls in (("trace_files", TraceFilesConfig), ("timeline", TimelineConfig)):
        value = get_dotted(profiler, f"init_args.{name}")
        if value is None:
            continue
        try:
            build_dataclass(cls, to_dict(value), f"trainer.profiler.init_args.{name}")
        except ConfigError as err:
            return err
    return None


def group_is_used(cfg: Any, default: Any) -> bool:
    """Whether the ``memprofiler:`` group installs a profiler.

    The group always has a value (its defaults) whether written or not. Left at its defaults
    while a callback entry or a model's ``memprofiler_cfg`` configures profiling, it is taken as
    not written, so that profiler is the only one.
    """
    value = get_dotted(cfg, GROUP)
    if value is None:
        return False
    if to_dict(value) != to_dict(default):
        return True
    return next(config_entries(cfg, use_group=False), None) is None


def config_entries(cfg: Any, use_group: bool) -> Iterator[tuple[str, Any, str]]:
    """(dotted key, raw value, origin) of each memprofiler config in ``cfg``."""
    group = get_dotted(cfg, GROUP) if use_group else None
    if group is not None:
        yield GROUP, group, "the `memprofiler:` group of `MemProfilerCLI`"
    callbacks = get_dotted(cfg, "trainer.callbacks")
    if callbacks is not None and not isinstance(callbacks, list):
        callbacks = [callbacks]
    for i, entry in enumerate(callbacks or []):
        if _is_profiler_callback(get_dotted(entry, "class_path")):
            key = f"trainer.callbacks[{i}].init_args.config"
            value = get_dotted(entry, "init_args.config")
            yield key, value, f"`trainer.callbacks[{i}]` ({get_dotted(entry, 'class_path')})"
    model = get_dotted(cfg, "model")
    for key in ("memprofiler_cfg", "init_args.memprofiler_cfg"):
        value = get_dotted(model, key)
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


def get_dotted(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if obj is None:
            return None
        try:
            obj = obj.get(part) if hasattr(obj, "get") else getattr(obj, part, None)
        except (KeyError, TypeError):
            return None
    return obj


def to_dict(value: Any) -> Any:
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value
