"""The optimizer a plan steps with, as a class and its arguments, so a change can swap either."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class OptimizerSpec:
    """``cls(params, **kwargs)``: an optimizer that ``advise`` builds in place of the given one."""

    cls: type[torch.optim.Optimizer]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self, params: Any) -> torch.optim.Optimizer:
        return self.cls(params, **self.kwargs)

    def python(self) -> str:
        """The constructor as a user writes it (``torch.optim.AdamW(params, lr=0.0001, fused=True)``)."""
        module = "torch.optim" if self.cls.__module__.startswith("torch.optim") else self.cls.__module__
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{module}.{self.cls.__name__}(params{', ' if args else ''}{args})"


def inspect_factory(factory: Callable[[Any], torch.optim.Optimizer]) -> OptimizerSpec | None:
    """The class and the hyper-parameters ``factory`` builds, read from one optimizer over one
    meta parameter; ``None`` when it does not return a ``torch.optim.Optimizer``."""
    try:
        opt = factory([nn.Parameter(torch.empty(1, device="meta"))])
    except Exception:  # the factory's own problem is the estimate's to report
        return None
    if not isinstance(opt, torch.optim.Optimizer):
        return None
    accepted = inspect.signature(type(opt).__init__).parameters
    kwargs = {k: v for k, v in opt.defaults.items() if k in accepted}
    return OptimizerSpec(type(opt), kwargs)


def steps_with(spec: OptimizerSpec) -> str:
    """``foreach``, ``fused`` or ``for-loop``: how the step runs on CUDA (unset is foreach there)."""
    if spec.kwargs.get("fused"):
        return "fused"
    if spec.kwargs.get("foreach") is False:
        return "for-loop"
    return "foreach"


def has_flag(spec: OptimizerSpec, name: str) -> bool:
    return name in inspect.signature(spec.cls.__init__).parameters
