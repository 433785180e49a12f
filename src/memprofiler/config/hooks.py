"""The forward hooks of ``enable_memory_hooks`` (``memory_hooks``): given as callables or dotted import paths."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memprofiler.errors import ConfigError

HookSpec = str | Callable[..., Any]

_DEFAULT_HOOKS = "memprofiler.collectors.module_hooks"


def resolve_hook(spec: HookSpec, key: str) -> Callable[..., Any]:
    """Turn a callable or dotted import path into a callable.

    Raises:
        ConfigError: the path does not import or does not name a callable.
    """
    if callable(spec):
        return spec
    module_name, _, attr = spec.rpartition(".")
    if not module_name:
        raise ConfigError(key, f"got {spec!r}; expected a dotted import path like `pkg.module.func`")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            key, f"cannot import {spec!r} ({err}); give an importable `module.function`"
        ) from None
    if not callable(obj):
        raise ConfigError(key, f"{spec!r} is not callable")
    return obj


@dataclass
class MemoryHooksConfig:
    """Forward hooks run on the profiled module during collected calls (``enable_memory_hooks``).

    A pre-forward hook is called as ``hook(state, module, args)``, a post-forward hook as
    ``hook(state, module, args, output)`` and a reset hook as ``hook(state)``. ``state`` is a
    :class:`memprofiler.collectors.module_hooks.HookState` held by the profiler; attributes
    named in ``save_hook_attrs`` are copied from it into the snapshot.
    """

    pre_forward_hooks: list[HookSpec] = field(
        default_factory=lambda: [f"{_DEFAULT_HOOKS}.rss_pre_forward", f"{_DEFAULT_HOOKS}.npp_pre_forward"]
    )
    """Called before the outermost forward of the profiled module."""
    post_forward_hooks: list[HookSpec] = field(
        default_factory=lambda: [f"{_DEFAULT_HOOKS}.rss_post_forward", f"{_DEFAULT_HOOKS}.npp_post_forward"]
    )
    """Called after the outermost forward of the profiled module."""
    reset_state_hooks: list[HookSpec] = field(default_factory=lambda: [f"{_DEFAULT_HOOKS}.reset_state"])
    """Called at the start of every collected call."""

    def __post_init__(self) -> None:
        for name in ("pre_forward_hooks", "post_forward_hooks", "reset_state_hooks"):
            for i, spec in enumerate(getattr(self, name)):
                resolve_hook(spec, f"{name}[{i}]")

    def resolved(self, name: str) -> list[Callable[..., Any]]:
        return [resolve_hook(s, f"memory_hooks.{name}[{i}]") for i, s in enumerate(getattr(self, name))]
