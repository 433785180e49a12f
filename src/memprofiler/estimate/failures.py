"""What goes wrong when a model cannot run on fake tensors, said in one line.

An op that needs tensor data (``.item()``), has a data-dependent output shape
(``nonzero``) or has no fake kernel (a custom op) cannot run on fake tensors; the user gets
the op, the module whose forward ran it, and the way out: real tensors on CPU.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from memprofiler.errors import ConfigError


def fake_errors() -> tuple[type[BaseException], ...]:
    from torch._subclasses import fake_tensor as ft

    return (
        ft.DataDependentOutputException,
        ft.DynamicOutputShapeException,
        ft.UnsupportedOperatorException,
        ft.UnsupportedFakeTensorException,
    )


def fake_failure(err: BaseException, module: str) -> ConfigError:
    func = getattr(err, "func", None)
    custom = re.search(r"CustomOpDef\((.*?)\)", str(err))
    op = str(func) if func is not None else custom.group(1) if custom else type(err).__name__
    why = {
        "DataDependentOutputException": "needs tensor data (`.item()`, `.tolist()`, a Python `if` on a tensor)",
        "DynamicOutputShapeException": "has a data-dependent output shape",
        "UnsupportedOperatorException": "has no fake (meta) kernel",
    }.get(type(err).__name__, "has no fake (meta) kernel" if custom else "cannot run on fake tensors")
    return ConfigError(
        "estimate.fake",
        f"op `{op}` in module `{module}` {why}; estimate with real tensors on CPU "
        "(`fake=False`, `--estimate.fake false`)",
    )


class ModuleStack:
    """The modules whose forward is running; left as it was when a forward raises."""

    def __init__(self, root: nn.Module) -> None:
        self._labels = {id(m): name or "(root)" for name, m in root.named_modules()}
        self.stack: list[str] = []
        self._handles: list[Any] = []

    def innermost(self) -> str:
        return self.stack[-1] if self.stack else "(outside forward)"

    def _push(self, module: nn.Module, args: Any) -> None:
        self.stack.append(self._labels.get(id(module), type(module).__name__))

    def _pop(self, module: nn.Module, args: Any, out: Any) -> None:
        if self.stack:
            self.stack.pop()

    def __enter__(self) -> ModuleStack:
        mod = nn.modules.module
        self._handles = [
            mod.register_module_forward_pre_hook(self._push),
            mod.register_module_forward_hook(self._pop),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
