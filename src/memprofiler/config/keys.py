"""Unknown config keys: the allowed keys at that level, a close match, and the ancestor's renames.

One message for every entry point (``MemProfilerConfig.from_any``, the callback's dict, the
``memprofiler:`` group of ``MemProfilerCLI``), so a typo reads the same wherever it is made.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Collection, Sequence
from typing import Any

from memprofiler.errors import ConfigError
from memprofiler.user_line import warn_at_user

#: Keys of finetuning-scheduler's ``MemProfilerCfg`` that memprofiler renamed or dropped, by
#: (our dataclass name, the ancestor's key). The value says what to write instead.
ANCESTOR_HINTS: dict[tuple[str, str], str] = {
    ("MemProfilerConfig", "saved_tensors_funcs"): (
        "a key of the ancestor's `MemProfilerCfg` that is gone: memprofiler counts saved tensors "
        "itself (`saved_tensors.*` keys) and takes no pack/unpack functions; drop the key and keep "
        "`enable_saved_tensors_hooks: true`"
    ),
    (
        "MemProfilerConfig",
        "enabled_funcs",
    ): "a key of the ancestor's `MemProfilerCfg`, renamed: use `collect_funcs`",
    ("ScheduleConfig", "warmup_steps"): (
        "a key of the ancestor's `MemProfilerCfg`, renamed: use `warmup_iters` (or the cyclic `warmup`)"
    ),
    ("ScheduleConfig", "max_step"): "a key of the ancestor's `MemProfilerCfg`, renamed: use `max_iter`",
}


#: Keys renamed by memprofiler itself, by (dataclass name, old key): the new key. The old one is
#: still read from mappings and YAML, with a warning naming both.
RENAMED: dict[tuple[str, str], str] = {
    ("MemProfilerConfig", "fsdp_mem_track_module_depth"): "module_mem_depth",
    ("MemProfilerConfig", "fsdp_mem_tracker_units"): "module_mem_units",
    ("MemProfilerConfig", "fsdp_mem_tracker_tabulate"): "module_mem_tabulate",
    ("CollectFuncsConfig", "fsdp"): "module_mem",
}


def renamed(cls: type, name: str, key: str, given: Collection[Any]) -> str:
    """The current name of key ``name`` of ``cls`` (at dotted ``key``): itself, or its new name
    with a one-line :class:`FutureWarning` naming both.

    Raises:
        ConfigError: the old and the new key are both in ``given``.
    """
    new = RENAMED.get((cls.__name__, name))
    if new is None:
        return name
    new_key = key[: len(key) - len(name)] + new
    if new in given:
        raise ConfigError(key, f"renamed to `{new_key}`, which is given too; keep only `{new_key}`")
    warn_at_user(f"memprofiler: config key `{key}` is deprecated; use `{new_key}`", FutureWarning)
    return new


def unknown_key(cls: type, name: str, key: str) -> ConfigError:
    """The error for key ``name`` that dataclass ``cls`` lacks, reported at dotted ``key``.

    Example:
        >>> from memprofiler.config import MemProfilerConfig
        >>> print(unknown_key(MemProfilerConfig, "colect_funcs", "colect_funcs"))  # doctest: +ELLIPSIS
        `colect_funcs`: unknown key; did you mean `collect_funcs`? allowed keys here: ...
    """
    allowed = sorted(f.name for f in dataclasses.fields(cls))
    hint = ANCESTOR_HINTS.get((cls.__name__, name))
    if hint is not None:
        return ConfigError(key, hint)
    new = RENAMED.get((cls.__name__, name))
    if new is not None:  # where the old name cannot be read (the `memprofiler:` group of the CLI)
        return ConfigError(key, f"renamed: use `{new}`")
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    guess = f"did you mean `{close[0]}`? " if close else ""
    return ConfigError(key, f"unknown key; {guess}allowed keys here: {', '.join(allowed)}")


def check_path(root: type, parts: Sequence[str], prefix: str) -> ConfigError | None:
    """Walk the dataclass tree from ``root`` along ``parts``; the error for the first unknown part.

    ``prefix`` is prepended to the reported key (``memprofiler`` for the CLI group). Returns
    ``None`` when every part is a field (the value, not the key, is then what is wrong).
    """
    cls: Any = root
    key = prefix
    for name in parts:
        key = f"{key}.{name}" if key else name
        if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
            return None  # below a leaf (a mapping-typed field): any key is allowed
        names = {f.name for f in dataclasses.fields(cls)}
        if name not in names:
            return unknown_key(cls, name, key)
        cls = _dataclass_in(typing.get_type_hints(cls)[name])
    return None


def _dataclass_in(tp: Any) -> Any:
    """The dataclass a field holds (also inside ``X | None``), else ``None``."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
    return None
