"""Options of the CUDA allocator-history recording (``allocator_history``) and the OOM flight recorder (``oom``)."""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.errors import ConfigError

#: ``stacks`` values torch's ``_record_memory_history`` accepts.
HISTORY_STACKS = ("python", "all")
#: ``context`` values torch's ``_record_memory_history`` accepts (``None`` keeps no tracebacks).
HISTORY_CONTEXTS = (None, "state", "alloc", "all")


def _check_history_options(max_entries: int, stacks: str, context: str | None) -> None:
    if max_entries < 1:
        raise ConfigError("max_entries", f"got {max_entries}; must be >= 1 (the history is a bounded ring)")
    if stacks not in HISTORY_STACKS:
        raise ConfigError("stacks", f"got {stacks!r}; allowed: python, all")
    if context not in HISTORY_CONTEXTS:
        raise ConfigError("context", f"got {context!r}; allowed: null, state, alloc, all")


@dataclass
class AllocatorHistoryConfig:
    """Options of CUDA allocator-history recording (``cuda_allocator_history``).

    Passed to ``torch.cuda.memory._record_memory_history`` while a collected window is open.
    """

    max_entries: int = 100_000
    """Alloc/free events kept (a ring: the newest win). Bounded because torch's default is
    unbounded and each entry costs host RAM (several KB with stacks)."""
    stacks: str = "python"
    """``python``: Python, TorchScript and inductor frames; ``all``: also C++ frames, which
    makes dumps about 100x slower and the pickles much larger."""
    context: str | None = "all"
    """Which events keep tracebacks: ``all`` (allocs and frees), ``alloc``, ``state`` (live
    blocks only) or ``null`` (none)."""

    def __post_init__(self) -> None:
        _check_history_options(self.max_entries, self.stacks, self.context)


@dataclass
class OomConfig:
    """The OOM flight recorder: a bounded allocator-history ring kept for the whole run.

    On a CUDA out-of-memory, and on any exception that ends training, it writes
    ``oom_rank_{rank}_{n}.pickle`` (for pytorch.org/memory_viz) and ``oom_rank_{rank}_{n}.yaml``
    (allocator stats, device free/total, the failed allocation, the step and the snapshots
    collected so far).
    """

    enabled: bool = False
    """Keep the ring and write the records. Off by default: recording costs about 2 us per
    allocation for the whole run."""
    max_entries: int = 100_000
    """Alloc/free events the ring keeps."""
    stacks: str = "python"
    """``python`` or ``all`` (C++ frames too; much slower to record and dump)."""
    context: str | None = "all"
    """Which events keep tracebacks: ``all``, ``alloc``, ``state`` or ``null``."""
    max_dumps: int = 5
    """Records written per rank and run at most, so a loop that keeps catching OOMs (a batch
    size search) cannot fill the disk."""

    def __post_init__(self) -> None:
        _check_history_options(self.max_entries, self.stacks, self.context)
        if self.max_dumps < 1:
            raise ConfigError("max_dumps", f"got {self.max_dumps}; must be >= 1")
