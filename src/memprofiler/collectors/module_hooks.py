"""Opt-in forward hooks (``enable_memory_hooks``): memory just before and after forward.

The hooks sit on every submodule of the profiled module (never process-wide) for the
collection window only, and fire the user's hook functions at the *outermost* forward
boundary. So the figures are
right whether ``training_step`` calls ``self(x)`` or a submodule directly, and psutil is
read twice per forward rather than once per module. Only the profiled module and the two
levels below it are hooked (:data:`HOOK_DEPTH`): a step runs ``self(x)`` or a submodule of
the first levels (``self.model(x)``); a deeper module called directly is not seen. Hooking
every module put torch's hook path on each of them, and installing and removing a pair of
hooks on each of 164 modules took about 2.5 ms of CPU per call for a function whose hooks are
not retained (``benchmarks/call_fixed_cost.py`` measured it).
Their state lives in a :class:`HookState` owned by the profiler, never on the user's modules.

A hook function that raises (a built-in one whose psutil call fails, or the user's) is
switched off with one warning naming it; the other hooks and training go on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil
from torch import nn

from memprofiler.collectors.base import BaseCollector, CallContext, Warn
from memprofiler.collectors.faults import HookFaults, no_warn
from memprofiler.collectors.module_tracker import ModuleStack
from memprofiler.collectors.saved_tensors import SavedTensorsCollector

#: Levels below the profiled module whose modules carry the hooks (see the module docstring).
HOOK_DEPTH = 2


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
        """Non-parameter bytes packed so far in this call (0 without saved-tensor hooks).

        Raises:
            RuntimeError: the saved-tensor hooks were switched off after a fault, so the
                figure would be wrong; the hook asking is switched off in turn.
        """
        if self.saved_tensors is None:
            return 0
        if self.saved_tensors.failed:
            raise RuntimeError("the saved-tensor hooks are switched off after a fault")
        return self.saved_tensors.packed_bytes


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
        warn: Warn = no_warn,
    ) -> None:
        self._pre, self._post, self._reset = list(pre), list(post), list(reset)
        self._save_attrs = list(save_attrs)
        self._retain_for = retain_for
        self.state = HookState(saved_tensors)
        self._stack: ModuleStack | None = None
        self.faults = HookFaults(warn)
        #: Levels below the profiled module that carry the hooks (``None``: every module).
        self.hook_depth: int | None = HOOK_DEPTH

    def _run(self, kind: str, hooks: list[Callable[..., Any]], *args: Any) -> None:
        """Call each hook; one that raises is warned about once and dropped from ``hooks``."""
        for hook in list(hooks):
            try:
                hook(*args)
            except Exception as err:
                hooks.remove(hook)
                name = getattr(hook, "__qualname__", repr(hook))
                self.faults.fault(f"{kind} memory hook `{name}`", err, "the attributes it sets are not saved")

    def _on_enter(self, module: nn.Module, label: str, depth: int, args: tuple[Any, ...]) -> None:
        if depth == 0 and not self.state.entered:
            self.state.entered = True
            self._run("pre-forward", self._pre, self.state, module, args)

    def _on_exit(self, module: nn.Module, label: str, depth: int, args: tuple[Any, ...], out: Any) -> None:
        if depth == 0:
            self._run("post-forward", self._post, self.state, module, args, out)

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self._run("reset-state", self._reset, self.state)
        self.state.entered = False  # ours, not the reset hooks': custom ones need not know it
        if ctx.module is not None and self._stack is None:
            self._stack = ModuleStack(
                ctx.module,
                self._on_enter,
                self._on_exit,
                faults=self.faults,
                part="collector `memory_hooks` module tracker",
                max_depth=self.hook_depth,
            )
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
