"""The one small interface every collector implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import nn

if TYPE_CHECKING:
    from memprofiler.core.profiler import MemProfiler

Metrics = dict[str, Any]


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
    """Per-call state shared between a collector's ``start`` and ``end``."""


@runtime_checkable
class Collector(Protocol):
    """A source of flat metrics for the start and end of a collected call.

    ``start`` runs just before the profiled function, ``end`` just after it (also when it
    raised, with ``ok=False``, so a collector can always undo what ``start`` set up). Both
    return flat metric dicts merged into the ``.start`` / ``.end`` snapshot.
    """

    name: str

    def start(self, ctx: CallContext) -> Mapping[str, Any]: ...

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]: ...

    def close(self) -> None:
        """Release anything held across calls (hooks, threads). Called at teardown."""
        ...


class BaseCollector:
    """No-op defaults for the optional collector events; subclass and override what you need.

    Besides ``start`` / ``end`` the profiler calls, when a collector defines them:

    * ``bind(profiler)`` once at set-up, for collectors that write their own files or read
      the profiler's snapshots;
    * ``bind_model(module, optimizers)`` once the model is prepared for training (sharded)
      and its optimizers exist (``MemProfiler.bind``, called by the callback at fit start);
    * ``step_end()`` at the end of a training step, for collectors whose window spans
      backward and the optimizer step;
    * ``warmup(ctx)`` on calls the schedule marks as warmup (before collection starts);
    * ``dump(save_dir, rank)`` whenever the profiler writes its files, to write extra files;
    * ``crash(exc)`` when training ends in an exception (before the files are written), to
      write crash records and stop anything that would outlive the run;
    * ``close()`` at teardown.
    """

    name = "base"

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        return {}

    def bind(self, profiler: MemProfiler) -> None:
        return None

    def warmup(self, ctx: CallContext) -> None:
        return None

    def crash(self, exc: BaseException) -> list[Path]:
        return []

    def dump(self, save_dir: Path, rank: int) -> list[Path]:
        return []

    def close(self) -> None:
        return None
