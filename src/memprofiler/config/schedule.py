"""Which calls are collected (``schedule``) and which functions get which collection type (``collect_funcs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from memprofiler.errors import ConfigError

#: Collection types a function can be registered for in ``collect_funcs``.
COLLECT_TYPES = ("cpu", "cuda", "cuda_allocator_history", "module_mem")


@dataclass
class ScheduleConfig:
    """Which calls of each ``@memprofilable`` function are collected.

    Calls are counted per function, starting at 1. The cyclic fields follow
    ``torch.profiler.schedule`` exactly (call ``n`` is profiler step ``n - 1``). The default
    collects exactly call 2, with call 1 as warmup.
    """

    skip_first: int = 0
    """Calls to skip entirely before the first cycle starts."""
    wait: int = 0
    """Idle calls at the start of every cycle."""
    warmup: int = 1
    """Calls per cycle before collection; allocator-history recording starts here."""
    active: int = 1
    """Collected calls per cycle."""
    repeat: int = 1
    """Number of cycles; ``0`` repeats forever."""
    warmup_iters: int | None = None
    """Short form (the ancestor's): collect calls with ``warmup_iters < call <= max_iter``."""
    max_iter: int | None = None
    """Short form: the last collected call. Defaults to ``warmup_iters + 1``."""
    follow_profiler: bool = False
    """Take the cyclic fields from the Trainer's :class:`~memprofiler.ExtendedPyTorchProfiler`
    ``schedule_cfg`` at set-up, so memory snapshots and the kernel trace cover the same calls
    (training call ``n`` is profiler step ``n - 1``, traced as ``ProfilerStep#{n-1}``). The
    cyclic fields given here are then ignored. Without that profiler: a warning, and this
    schedule is used as given."""

    _CYCLIC: ClassVar[tuple[str, ...]] = ("skip_first", "wait", "warmup", "active", "repeat")

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"got {getattr(self, name)}; must be >= 0")
        if self.active < 1:
            raise ConfigError("active", f"got {self.active}; must be >= 1")
        if self.follow_profiler and self.is_short_form:
            raise ConfigError(
                "follow_profiler",
                "cannot be combined with the short form `warmup_iters`/`max_iter`; drop one of them",
            )
        if self.is_short_form:
            defaults = ScheduleConfig.__dataclass_fields__
            changed = [n for n in self._CYCLIC if getattr(self, n) != defaults[n].default]
            if changed:
                raise ConfigError(
                    changed[0],
                    "cannot be combined with the short form `warmup_iters`/`max_iter`; use one form",
                )
            if self.warmup_iters is None:
                self.warmup_iters = 1
            if self.warmup_iters < 0:
                raise ConfigError("warmup_iters", f"got {self.warmup_iters}; must be >= 0")
            if self.max_iter is None:
                self.max_iter = self.warmup_iters + 1
            if self.max_iter <= self.warmup_iters:
                raise ConfigError(
                    "max_iter", f"got {self.max_iter}; must be greater than warmup_iters={self.warmup_iters}"
                )

    @property
    def is_short_form(self) -> bool:
        return self.warmup_iters is not None or self.max_iter is not None


@dataclass
class CollectFuncsConfig:
    """Which functions get which collection type.

    A name is a ``@memprofilable`` method, a ``prof.profile(name)`` block, or, under the
    Lightning callback, any method of the LightningModule, DataModule or strategy: the
    callback wraps it by name at set-up, no decorator needed. The names in ``default`` are
    added to every other set.
    """

    default: list[str] = field(default_factory=lambda: ["training_step"])
    """Functions collected by every enabled collection type."""
    cpu: list[str] = field(default_factory=list)
    """Extra functions for host memory (RSS, VMS, peak RSS)."""
    cuda: list[str] = field(default_factory=list)
    """Extra functions for ``torch.cuda.memory_stats()``."""
    cuda_allocator_history: list[str] = field(default_factory=list)
    """Extra functions for CUDA allocator-history pickles."""
    module_mem: list[str] = field(default_factory=list)
    """Extra functions for the module-wise trackers (``track_fsdp_mem``, ``track_module_mem``)."""

    def funcs_for(self, collect_type: str) -> frozenset[str]:
        """Return the functions collected by ``collect_type``, ``default`` included."""
        if collect_type not in COLLECT_TYPES:
            raise ConfigError("collect_funcs", f"unknown collection type {collect_type!r}")
        return frozenset(self.default) | frozenset(getattr(self, collect_type))

    def all_funcs(self) -> frozenset[str]:
        """Every function named anywhere."""
        out = frozenset(self.default)
        for t in COLLECT_TYPES:
            out |= frozenset(getattr(self, t))
        return out

    def keyed_funcs(self) -> dict[str, str]:
        """Every function named anywhere -> the first dotted key naming it (``collect_funcs.cpu``)."""
        keys: dict[str, str] = {}
        for t in ("default", *COLLECT_TYPES):
            for name in getattr(self, t):
                keys.setdefault(name, f"collect_funcs.{t}")
        return keys
