"""Forward hooks that keep a stack of the module qualified names currently running."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

ROOT_NAME = "(root)"
OUTSIDE_NAME = "(outside forward)"


class ModuleStack:
    """Installs pre/post forward hooks on every submodule of ``root`` while active.

    ``on_enter`` / ``on_exit`` are called with ``(module, depth)`` where ``depth`` counts the
    tracked modules already running, so ``depth == 0`` is an outermost forward even when the
    caller ran a submodule directly instead of ``root(...)``.
    """

    def __init__(
        self,
        root: nn.Module,
        on_enter: Callable[[nn.Module, str, int, tuple[Any, ...]], None] | None = None,
        on_exit: Callable[[nn.Module, str, int, tuple[Any, ...], Any], None] | None = None,
    ) -> None:
        self._root = root
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._handles: list[RemovableHandle] = []
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
        for name, mod in self._root.named_modules():
            label = name or ROOT_NAME
            self._handles.append(mod.register_forward_pre_hook(self._make_pre(label)))
            self._handles.append(mod.register_forward_hook(self._make_post(label), always_call=True))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.stack.clear()

    def _make_pre(self, label: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self._on_enter is not None:
                self._on_enter(module, label, len(self.stack), args)
            self.stack.append(label)

        return pre

    def _make_post(self, label: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.stack:
                self.stack.pop()
            if self._on_exit is not None:
                self._on_exit(module, label, len(self.stack), args, output)

        return post
