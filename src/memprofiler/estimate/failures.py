"""What goes wrong when a model cannot run on fake tensors, said in one line.

An op that needs tensor data (``.item()``), has a data-dependent output shape
(``nonzero``) or has no fake kernel (a custom op) cannot run on fake tensors; the user gets
the op, the module whose forward ran it, and the way out: real tensors on CPU. A forward that
puts a tensor on a fixed device gets the module and the fix; any other error in a module's
forward (a batch whose shapes do not fit the model) names the module and the shapes of its
inputs.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
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


def shape_failure(err: BaseException, module: str, kind: str, shapes: list[list[int]]) -> ConfigError:
    """A module's forward raised on the batch (most often shapes that do not fit the model)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    got = ", ".join(str(s) for s in shapes) or "no tensors"
    return ConfigError(
        "batch",
        f"module `{module}` ({kind}) failed on inputs of shape {got}: {first.rstrip('.')}; make the "
        "batch's shapes fit the model (`fit` would stop here too)",
    )


def raised_at(err: BaseException, outside: str | None = None) -> str:
    """`` (train.py:30)``: the file and line of the last frame of ``err``'s traceback (of the last
    one not under the path ``outside``, given), or ``""`` where there is none."""
    frames = [(tb.tb_frame.f_code.co_filename, tb.tb_lineno) for tb in _walk(err.__traceback__)]
    if outside is not None:
        frames = [f for f in frames if not f[0].startswith(outside)]
    return f" ({Path(frames[-1][0]).name}:{frames[-1][1]})" if frames else ""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (``""`` for none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def _walk(tb: Any) -> Iterator[Any]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def forward_failure(err: BaseException, module: str, kind: str) -> ConfigError:
    """A module's forward raised an error of its own (a ``ValueError`` on an argument it was not
    given, a ``KeyError`` on a config key): one line with where it was raised."""
    first, where = first_line(err), raised_at(err)
    return ConfigError(
        "model",
        f"module `{module}` ({kind}) raised {type(err).__name__}{where}: {first.rstrip('.')}; the model "
        "fails on this batch and plan as a training step would (from Python, the error's cause holds "
        "the traceback)",
    )


#: Fake tensors' device mismatch: its own error type with the two devices since torch 2.12,
#: "Unhandled FakeTensor Device Propagation for OP, found two different devices A, B" before.
_MIXED = re.compile(r"found (?:at least )?two (?:different )?devices,? ([\w:]+),? (?:and )?([\w:]+)")


def mixed_devices(err: BaseException) -> tuple[str, str] | None:
    """The two devices a fake op was given tensors on, or None when ``err`` is not that."""
    common, other = getattr(err, "common_device", None), getattr(err, "device", None)
    if isinstance(common, torch.device) and isinstance(other, torch.device):
        return str(common), str(other)
    found = _MIXED.search(str(err))
    return (found.group(1), found.group(2)) if found else None


def device_failure(devices: tuple[str, str], module: str, kind: str) -> ConfigError:
    """A module's forward put a tensor on a fixed device, which the estimate's tensors are not on."""
    return ConfigError(
        "model",
        f"module `{module}` ({kind}) mixed tensors on {devices[0]} and {devices[1]}: the estimate's "
        'tensors are on cpu on every machine, so a tensor put on a fixed device (`device="cuda"`, '
        "`.cuda()`) meets them; make it on its input's device (`device=x.device`), as `fit` on "
        "another device would need too",
    )


class _DropMetaFailureLog(logging.Filter):
    """Drops fake tensors' multi-line log of a failing meta kernel; the error is re-raised anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


@contextlib.contextmanager
def quiet_meta_failures() -> Iterator[None]:
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    drop = _DropMetaFailureLog()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class ModuleStack:
    """The modules whose forward is running, with their inputs' shapes; left as it was when a
    forward raises."""

    def __init__(self, root: nn.Module) -> None:
        self._labels = {id(m): name or "(root)" for name, m in root.named_modules()}
        self.stack: list[str] = []
        self._kinds: list[str] = []
        self._shapes: list[list[list[int]]] = []
        self._handles: list[Any] = []

    def innermost(self) -> str:
        return self.stack[-1] if self.stack else "(outside forward)"

    def innermost_inputs(self) -> tuple[str, list[list[int]]]:
        """The innermost running module's class name and the shapes of its tensor inputs."""
        return (self._kinds[-1], self._shapes[-1]) if self.stack else ("", [])

    def _push(self, module: nn.Module, args: Any) -> None:
        self.stack.append(self._labels.get(id(module), type(module).__name__))
        self._kinds.append(type(module).__name__)
        self._shapes.append([list(a.shape) for a in args if isinstance(a, torch.Tensor)])

    def _pop(self, module: nn.Module, args: Any, out: Any) -> None:
        if self.stack:
            self.stack.pop()
            self._kinds.pop()
            self._shapes.pop()

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


def check_batch(batch: Any) -> None:
    """Refuse a batch with a tensor of 0 rows: its step allocates no activations for it, and the
    estimate would look like a real one.

    Raises:
        ConfigError: names ``batch``, the tensor's place in it and its shape.
    """
    from torch.utils._pytree import keystr, tree_flatten_with_path

    for path, leaf in tree_flatten_with_path(batch)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.dim() >= 1 and leaf.shape[0] == 0:
            where = f"batch{keystr(path)}" if path else "the batch"
            raise ConfigError(
                "batch",
                f"{where} has 0 rows (shape {tuple(leaf.shape)}): a step on it allocates no activations; "
                "pass one batch of the size the job trains with",
            )
