"""Opt-in forward hooks (``enable_memory_hooks``): memory just before and after forward.

The hooks sit on every submodule of the profiled module for the collection window only,
and fire the user's hook functions at the *outermost* forward boundary. So the figures are
right whether ``training_step`` calls ``self(x)`` or a submodule directly, and psutil is
read twice per forward rather than once per module. Their state lives in a
:class:`HookState` owned by the profiler, never on the user's modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil
from torch import nn

from memprofiler.collectors.base import BaseCollector, CallContext
from memprofiler.collectors.module_tracker import ModuleStack
from memprofiler.collectors.saved_tensors import SavedTensorsCollector


class HookState:
    """Scratch space for memory hooks; attributes named in ``save_hook_attrs`` are saved."""

    def __init__(self, saved_tensors: SavedTensorsCollector | None = None) -> None:
        self.process = psutil.Process()
        self.saved_tensors = saved_tensors
        self.entered = False

    def __getattr__(self, name: str) -> Any:
        # Hooks add their own attributes; an unset one is a plain AttributeError.
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def packed_bytes(self) -> int:
        """Non-parameter bytes packed so far in this call (0 without saved-tensor hooks)."""
        return self.saved_tensors.packed_bytes if self.saved_tensors is not None else 0


def reset_state(state: HookState) -> None:
    """Default reset hook: clear the figures of the previous call."""
    for name in list(vars(state)):
        if name not in ("process", "saved_tensors"):
            delattr(state, name)
    state.entered = False


def rss_pre_forward(state: HookState, module: nn.Module, args: tuple[Any, ...]) -> None:
    state.rss_pre_forward = state.process.memory_info().rss


def rss_post_forward(state: HookState, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    state.rss_post_forward = state.process.memory_info().rss
    state.rss_diff = state.rss_post_forward - getattr(state, "rss_pre_forward", state.rss_post_forward)


def npp_pre_forward(state: HookState, module: nn.Module, args: tuple[Any, ...]) -> None:
    state.npp_pre_forward = state.packed_bytes()


def npp_post_forward(state: HookState, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    state.npp_post_forward = state.packed_bytes()
    state.npp_diff = state.npp_post_forward - getattr(state, "npp_pre_forward", 0)


class ModuleHooksCollector(BaseCollector):
    """Runs the configured memory hooks and saves ``save_hook_attrs`` into the end snapshot."""

    name = "memory_hooks"

    def __init__(
        self,
        pre: Sequence[Callable[..., Any]],
        post: Sequence[Callable[..., Any]],
        reset: Sequence[Callable[..., Any]],
        save_attrs: Sequence[str],
        retain_for: frozenset[str],
        saved_tensors: SavedTensorsCollector | None,
    ) -> None:
        self._pre, self._post, self._reset = list(pre), list(post), list(reset)
        self._save_attrs = list(save_attrs)
        self._retain_for = retain_for
        self.state = HookState(saved_tensors)
        self._stack: ModuleStack | None = None

    def _on_enter(self, module: nn.Module, label: str, depth: int, args: tuple[Any, ...]) -> None:
        if depth == 0 and not self.state.entered:
            self.state.entered = True
            for hook in self._pre:
                hook(self.state, module, args)

    def _on_exit(self, module: nn.Module, label: str, depth: int, args: tuple[Any, ...], out: Any) -> None:
        if depth == 0:
            for hook in self._post:
                hook(self.state, module, args, out)

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        for hook in self._reset:
            hook(self.state)
        self.state.entered = False  # ours, not the reset hooks': custom ones need not know it
        if ctx.module is not None and self._stack is None:
            self._stack = ModuleStack(ctx.module, self._on_enter, self._on_exit)
            self._stack.install()
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        keep = ok and ctx.fn_name in self._retain_for and not ctx.closes_window
        if not keep:
            self.close()
        return {a: getattr(self.state, a) for a in self._save_attrs if hasattr(self.state, a)}

    def close(self) -> None:
        if self._stack is not None:
            self._stack.remove()
            self._stack = None
