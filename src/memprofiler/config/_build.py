"""Build typed config dataclasses from plain mappings, with dotted-key error messages."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

from memprofiler.config.keys import renamed, unknown_key
from memprofiler.errors import ConfigError

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors: list[ConfigError] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(err)
        allowed = " or ".join(_type_name(a) for a in args)
        raise ConfigError(key, f"got {value!r} ({type(value).__name__}); expected {allowed}")
    if origin in (list, tuple, set, frozenset):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
            raise ConfigError(key, f"got {value!r}; expected a list")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"got {value!r}; expected a mapping")
        return dict(value)
    if origin is Callable or tp is Callable or origin is typing.get_origin(Callable[..., Any]):
        if not callable(value):
            raise ConfigError(key, f"got {value!r}; expected a callable or a dotted import path")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"got {value!r}; expected a mapping of {tp.__name__} fields")
        return build_dataclass(tp, value, key)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"got {value!r}; expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"got {value!r}; expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"got {value!r}; expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"got {value!r}; expected a string")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(key, f"got {value!r}; expected {_type_name(tp)}")
    return value


def build_dataclass(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Instantiate dataclass ``cls`` from ``data``, checking keys and types recursively.

    Raises:
        ConfigError: naming the dotted key of an unknown field, a wrong type, or a value the
            dataclass's ``__post_init__`` rejects.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, f"got {data!r}; expected a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in fields:
            name = renamed(cls, str(name), key, data)
        if name not in fields:
            raise unknown_key(cls, str(name), key)
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.prefixed(prefix) if prefix else err from None
