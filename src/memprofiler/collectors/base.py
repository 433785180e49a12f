"""The one small interface every collector implements, and what a collector sees of the profiler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

Metrics = dict[str, Any]
#: ``(function name, call number)`` of a collected call.
CallId = tuple[str, int]


@dataclass
class CallContext:
    """What a collector knows about the call being collected."""

    fn_name: str
    """Name of the ``@memprofilable`` function."""
    call: int
    """1-based call number of that function."""
    rank: int
    """Global rank of this process."""
    module: nn.Module | None = None
    """The module whose method is profiled (the LightningModule), if any."""
    closes_window: bool = False
    """True when the next call of this function is neither warmed up nor collected."""
    scratch: dict[str, Any] = field(default_factory=dict)
    """A collector's private state between its ``start`` and ``end`` (keys prefixed by its name)."""

    @property
    def call_id(self) -> CallId:
        return (self.fn_name, self.call)


class Warn(Protocol):
    """The profiler's warn-once, given to a collector when it is built (``collectors/registry.py``)."""

    def __call__(self, message: str, all_ranks: bool = False) -> None:
        """Warn once per profiler, on rank zero unless ``all_ranks``."""
        ...


class ProfilerView(Protocol):
    """What a collector may see of the profiler: given to :meth:`Collector.bind` at set-up."""

    @property
    def rank(self) -> int: ...

    @property
    def save_dir(self) -> Path:
        """The run directory, resolved and checked once by the profiler."""
        ...

    @property
    def snapshots(self) -> Mapping[str, Mapping[str, Any]]:
        """The snapshots collected so far (read only)."""
        ...

    @property
    def module(self) -> nn.Module | None:
        """The model bound (``bind``), given at set-up, or of the method the profiler is attached to."""
        ...

    @property
    def optimizers(self) -> Sequence[torch.optim.Optimizer]:
        """The optimizers bound with the model (none before ``bind``)."""
        ...

    def current_step(self) -> int | None: ...

    def call_counts(self) -> Mapping[str, int]:
        """Calls counted so far, per ``@memprofilable`` function."""
        ...


class Collector(Protocol):
    """A source of flat metrics for the start and end of a collected call.

    ``start`` runs just before the profiled function, ``end`` just after it (also when it
    raised, with ``ok=False``, so a collector can always undo what ``start`` set up). Both
    return flat metric dicts merged into the ``.start`` / ``.end`` snapshot. Every event is
    part of the interface; :class:`BaseCollector` gives no-op defaults. What a collector can
    do beyond a call is declared by :attr:`spans_step`, never probed.
    """

    name: str
    spans_step: bool
    """Its window runs on to the end of the training step: :meth:`step_end` closes it."""

    def bind(self, view: ProfilerView) -> None:
        """Once at set-up: the profiler's read-only view (run directory, rank, warnings)."""
        ...

    def bind_model(self, module: nn.Module | None, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Once the model is prepared for training (sharded) and its optimizers exist."""
        ...

    def warmup(self, ctx: CallContext) -> None:
        """On calls the schedule marks as warmup (before collection starts)."""
        ...

    def start(self, ctx: CallContext) -> Mapping[str, Any]: ...

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]: ...

    def step_end(self) -> Mapping[CallId, Metrics]:
        """At the end of a training step: metrics for the ``end`` snapshots of the calls given."""
        ...

    def dump(self) -> list[Path]:
        """Whenever the profiler writes its files: write this collector's own files."""
        ...

    def crash(self, exc: BaseException) -> list[Path]:
        """Training ends with ``exc``: write crash records, stop what would outlive the run."""
        ...

    def close(self) -> None:
        """Release anything held across calls (hooks, threads). Called at teardown."""
        ...


class BaseCollector:
    """No-op defaults for every collector event; subclass and override what you need."""

    name = "base"
    spans_step = False

    def bind(self, view: ProfilerView) -> None:
        return None

    def bind_model(self, module: nn.Module | None, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        return None

    def warmup(self, ctx: CallContext) -> None:
        return None

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        return {}

    def step_end(self) -> Mapping[CallId, Metrics]:
        return {}

    def dump(self) -> list[Path]:
        return []

    def crash(self, exc: BaseException) -> list[Path]:
        return []

    def close(self) -> None:
        return None
