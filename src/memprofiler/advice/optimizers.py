"""The optimizer a plan steps with, as a class and its arguments, so a change can swap either."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class OptimizerSpec:
    """``cls(params, **kwargs)``: an optimizer that ``advise`` builds in place of the given one."""

    cls: type[torch.optim.Optimizer]
    kwargs: dict[str, Any] = field(default_factory=dict)
    scalar_reads: bool = False
    """Its step reads values with ``.item()`` that only scale the update (:func:`reading_scalars`)."""

    def build(self, params: Any) -> torch.optim.Optimizer:
        opt = self.cls(params, **self.kwargs)
        return reading_scalars(opt) if self.scalar_reads else opt

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


_SCALAR_OPS = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default})


class _ScalarReads(TorchDispatchMode):
    """``.item()`` of a tensor without values answers 1: inside an optimizer step whose reads of
    values (a step count, a norm) only scale the update, never a shape, so any value gives the
    same tensors. Every other op, and a value the modes below know, passes through unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func not in _SCALAR_OPS:
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        except DataDependentOutputException:
            self.answered += 1
            dtype = args[0].dtype
            return True if dtype is torch.bool else 1.0 if dtype.is_floating_point else 1


def reading_scalars(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``opt`` with its ``step`` answering the ``.item()`` reads fake tensors cannot answer.

    torch's Adafactor reads its step count and each parameter's and update's norm with ``.item()``
    in every step; the values only scale the update, so on fake tensors each read gets 1 and the
    step makes the same tensors as on real ones. Applied by hand, it is what ``advise`` estimates:

    Example:
        >>> import torch
        >>> from memprofiler import estimate_memory
        >>> net = torch.nn.Linear(64, 64, device="meta")
        >>> adafactor = lambda ps: reading_scalars(torch.optim.Adafactor(ps, lr=1e-2))
        >>> estimate_memory(net, torch.randn(8, 64), optimizer=adafactor).peak_bytes > 0
        True
    """
    step = type(opt).step.__get__(opt)

    @functools.wraps(step)
    def stepping(*args: Any, **kwargs: Any) -> Any:
        with _ScalarReads():
            return step(*args, **kwargs)

    opt.step = stepping  # type: ignore[method-assign]
    return opt
