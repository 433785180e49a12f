"""Which submodules of a model are running: a stack kept by hooks on that model's modules only."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from memprofiler.collectors.faults import HookFaults

ROOT_NAME = "(root)"
OUTSIDE_NAME = "(outside forward)"


def module_labels(root: nn.Module) -> dict[int, str]:
    """``id(module) -> qualified name`` for every submodule of ``root`` (``(root)`` for itself)."""
    return {id(mod): name or ROOT_NAME for name, mod in root.named_modules()}


class ModuleStack:
    """While installed, tracks which submodules of ``root`` are running.

    A forward pre-hook and an always-called forward hook sit on each submodule of ``root``
    while installed, never process-wide hooks: every other model's modules keep
    ``nn.Module``'s hook-free fast path, and :meth:`remove` leaves nothing behind.
    ``on_enter`` / ``on_exit`` get ``(module, label, depth, args[, output])`` where ``depth``
    counts the tracked modules already running, so ``depth == 0`` is an outermost forward even
    when the caller ran a submodule directly instead of ``root(...)``. The module list is
    taken when installed. ``max_depth`` hooks only the modules at most that many levels below
    ``root`` (``root`` itself is level 0): enough to see an outermost forward, at a few hooks
    instead of one pair per module.

    An exception in ``on_enter`` / ``on_exit`` is reported to ``faults`` as ``part`` and the
    stack stops calling them (the hooks stay until :meth:`remove`): training goes on.
    """

    def __init__(
        self,
        root: nn.Module,
        on_enter: Callable[[nn.Module, str, int, tuple[Any, ...]], None] | None = None,
        on_exit: Callable[[nn.Module, str, int, tuple[Any, ...], Any], None] | None = None,
        labels: dict[int, str] | None = None,
        faults: HookFaults | None = None,
        part: str = "module tracker",
        max_depth: int | None = None,
    ) -> None:
        self._root = root
        self._max_depth = max_depth
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._handles: list[RemovableHandle] = []
        self._labels: dict[int, str] = labels if labels is not None else {}
        self._faults = faults
        self._part = part
        self.failed = False
        self.stack: list[str] = []

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else OUTSIDE_NAME

    def install(self) -> None:
        if self._handles:
            return
        if not self._labels:
            self._labels = module_labels(self._root)
        for mod in self._root.modules():
            label = self._labels.get(id(mod))
            if label is None or (
                self._max_depth is not None and label != ROOT_NAME and label.count(".") >= self._max_depth
            ):
                continue
            # The label is bound into the hook: no lookup per module call.
            self._handles.append(mod.register_forward_pre_hook(partial(self._pre, label)))
            self._handles.append(mod.register_forward_hook(partial(self._post, label), always_call=True))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.stack.clear()

    def _fail(self, err: Exception) -> None:
        self.failed = True
        self.stack.clear()
        if self._faults is not None:
            self._faults.fault(self._part, err, "its figures are left out")
        else:
            raise err

    def _pre(self, label: str, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self.failed:
            return
        if self._on_enter is not None:
            try:
                self._on_enter(module, label, len(self.stack), args)
            except Exception as err:
                self._fail(err)
                return
        self.stack.append(label)

    def _post(self, label: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.failed:
            return
        if self.stack:
            self.stack.pop()
        if self._on_exit is not None:
            try:
                self._on_exit(module, label, len(self.stack), args, output)
            except Exception as err:
                self._fail(err)
