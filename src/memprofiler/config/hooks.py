"""The forward hooks of ``enable_memory_hooks`` (``memory_hooks``): given as callables or dotted import paths."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memprofiler.errors import ConfigError

HookSpec = str | Callable[..., Any]

_DEFAULT_HOOKS = "memprofiler.collectors.module_hooks"

#: How each kind of hook is called, by field name.
HOOK_CALLS: dict[str, str] = {
    "pre_forward_hooks": "hook(state, module, args)",
    "post_forward_hooks": "hook(state, module, args, output)",
    "reset_state_hooks": "hook(state)",
}
#: First-parameter names of the ancestor's hooks, which take the module (not a state) first.
_ANCESTOR_FIRST = ("module", "model", "mod", "m")


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


def check_hook_signature(fn: Callable[..., Any], field_name: str, key: str) -> None:
    """Refuse a hook that cannot take the arguments memprofiler calls it with.

    A hook whose first parameter is ``module`` or ``model`` is one written for the ancestor
    (finetuning-scheduler), which passes the module first: it would bind, then fail at the first
    collected call, so it is refused here too.

    Raises:
        ConfigError: naming ``key``, the hook's signature and the expected call.
    """
    call = HOOK_CALLS[field_name]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: nothing to check
        return
    n_args = call.count(",") + 1
    bare = sig.replace(
        parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
        return_annotation=sig.empty,
    )
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}{bare}"
    fix = f"memprofiler calls it as `{call}` with a `memprofiler.collectors.module_hooks.HookState`"
    try:
        sig.bind(*range(n_args))
    except TypeError:
        raise ConfigError(key, f"`{name}` does not fit: {fix}") from None
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if positional and positional[0].name in _ANCESTOR_FIRST:
        raise ConfigError(
            key,
            f"`{name}` looks like a finetuning-scheduler hook (module first): {fix} as the first "
            "argument; see docs/migration.md",
        )


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
        for name in HOOK_CALLS:
            for i, spec in enumerate(getattr(self, name)):
                key = f"{name}[{i}]"
                check_hook_signature(resolve_hook(spec, key), name, key)

    def resolved(self, name: str) -> list[Callable[..., Any]]:
        return [resolve_hook(s, f"memory_hooks.{name}[{i}]") for i, s in enumerate(getattr(self, name))]
