"""Forward hooks that keep a stack of the module qualified names currently running."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

ROOT_NAME = "(root)"
OUTSIDE_NAME = "(outside forward)"


def module_labels(root: nn.Module) -> dict[int, str]:
    """``id(module) -> qualified name`` for every submodule of ``root`` (``(root)`` for itself)."""
    return {id(mod): name or ROOT_NAME for name, mod in root.named_modules()}


class ModuleStack:
    """While installed, tracks which submodules of ``root`` are running.

    Two process-wide forward hooks are registered for the duration (not two per module):
    installing and removing them costs the same for 10 modules or 10,000, and modules outside
    ``root`` are ignored by one dict lookup. ``on_enter`` / ``on_exit`` get
    ``(module, label, depth, args[, output])`` where ``depth`` counts the tracked modules
    already running, so ``depth == 0`` is an outermost forward even when the caller ran a
    submodule directly instead of ``root(...)``. The module list is taken when installed.
    """

    def __init__(
        self,
        root: nn.Module,
        on_enter: Callable[[nn.Module, str, int, tuple[Any, ...]], None] | None = None,
        on_exit: Callable[[nn.Module, str, int, tuple[Any, ...], Any], None] | None = None,
        labels: dict[int, str] | None = None,
    ) -> None:
        self._root = root
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._handles: list[RemovableHandle] = []
        self._labels: dict[int, str] = labels if labels is not None else {}
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
        self._handles.append(register_module_forward_pre_hook(self._pre))
        self._handles.append(register_module_forward_hook(self._post, always_call=True))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.stack.clear()

    def _pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        label = self._labels.get(id(module))
        if label is None:
            return
        if self._on_enter is not None:
            self._on_enter(module, label, len(self.stack), args)
        self.stack.append(label)

    def _post(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        label = self._labels.get(id(module))
        if label is None:
            return
        if self.stack:
            self.stack.pop()
        if self._on_exit is not None:
            self._on_exit(module, label, len(self.stack), args, output)
