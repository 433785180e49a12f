"""One owner for the process's single CUDA allocator-history recording.

The allocator has one recording per process. Both the collected-window history and the
OOM flight recorder want it, with possibly different options, and the user may already
have turned it on. :class:`HistoryRecording` keeps a set of holders: recording runs while
any holder remains, with options that satisfy all of them, and stops (``enabled=None``)
when the last one lets go. A recording that was on before we touched it belongs to the
user: it is left running, never re-configured and never stopped.

The ring's size is fixed for as long as it records. The allocator's ``RingBuffer`` only
moves its bound on a new ``max_entries``: it neither truncates nor reorders what it holds,
so resizing a ring that has wrapped scrambles the order of every later snapshot. Holders
therefore :meth:`~HistoryRecording.plan` their size up front, and a ring starts at the
largest size planned, which a later holder can use without a resize.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memprofiler.collectors.base import Warn
from memprofiler.collectors.cuda_backend import CudaBackend

_CONTEXT_ORDER = (None, "state", "alloc", "all")


@dataclass(frozen=True)
class HistoryOptions:
    """Arguments of one ``_record_memory_history`` call."""

    max_entries: int
    stacks: str
    context: str | None

    def merge(self, other: HistoryOptions) -> HistoryOptions:
        """The least options that give both holders what they asked for."""
        return HistoryOptions(
            max_entries=max(self.max_entries, other.max_entries),
            stacks="all" if "all" in (self.stacks, other.stacks) else "python",
            context=max(self.context, other.context, key=_CONTEXT_ORDER.index),
        )


class HistoryRecording:
    """Reference-counted control of allocator-history recording.

    Args:
        backend: the CUDA seam.
        warn: called once with a message when a user's own recording is found.

    Example:
        >>> rec = HistoryRecording(backend, warn)  # doctest: +SKIP
        >>> rec.acquire("window:training_step", HistoryOptions(100_000, "python", "all"))
        >>> rec.release("window:training_step")  # the last holder: recording stops
    """

    def __init__(self, backend: CudaBackend, warn: Warn) -> None:
        self._backend = backend
        self._warn = warn
        self._holders: dict[str, HistoryOptions] = {}
        self._applied: HistoryOptions | None = None
        self._foreign = False
        self._planned_entries = 0
        self._warned_size = False

    @property
    def recording(self) -> bool:
        """Whether history is being recorded for at least one holder (by us or the user)."""
        return bool(self._holders) and (self._foreign or self._applied is not None)

    @property
    def foreign(self) -> bool:
        """Whether the running recording is the user's own."""
        return self._foreign

    def holders(self) -> frozenset[str]:
        return frozenset(self._holders)

    @property
    def ring_entries(self) -> int | None:
        """``max_entries`` of the ring we run now; ``None`` while we record nothing."""
        return None if self._applied is None else self._applied.max_entries

    def plan(self, options: HistoryOptions) -> None:
        """Announce a holder that may acquire later, so the ring is started big enough for it."""
        self._planned_entries = max(self._planned_entries, options.max_entries)

    def acquire(self, holder: str, options: HistoryOptions) -> None:
        """Make sure history is recorded for ``holder``; cheap when it already is."""
        if self._holders.get(holder) == options:
            return
        if not self._holders and self._applied is None:
            self._foreign = bool(self._backend.is_history_enabled())
            if self._foreign:
                self._warn(
                    "CUDA allocator-history recording was already on when memprofiler needed it; "
                    "it is left running with your settings and memprofiler will not stop it"
                )
        self._holders[holder] = options
        self._apply()

    def release(self, holder: str) -> None:
        """Drop ``holder``; the last one out stops our recording."""
        if self._holders.pop(holder, None) is None:
            return
        self._apply()
        if not self._holders:
            # Re-detect next time: the user may stop or start their own recording meanwhile.
            self._foreign = False

    def release_all(self) -> None:
        for holder in list(self._holders):
            self.release(holder)

    def _apply(self) -> None:
        if self._foreign:
            return
        want: HistoryOptions | None = None
        for opts in self._holders.values():
            want = opts if want is None else want.merge(opts)
        if want is not None:
            want = replace(want, max_entries=self._ring_size(want.max_entries))
        if want == self._applied:
            return
        if want is None:
            self._backend.record_memory_history(None)
        else:
            self._backend.record_memory_history(
                "all", context=want.context, stacks=want.stacks, max_entries=want.max_entries
            )
        self._applied = want

    def _ring_size(self, wanted: int) -> int:
        """The size to record with: the planned maximum at start, unchanged while live."""
        if self._applied is None:
            return max(wanted, self._planned_entries)
        live = self._applied.max_entries
        if wanted > live and not self._warned_size:
            self._warned_size = True
            self._warn(
                f"a CUDA allocator-history holder asked for max_entries={wanted}, but the ring "
                f"already records with {live}; the allocator cannot resize a live ring without "
                f"scrambling its order, so at most {live} entries are kept. Set "
                "`allocator_history.max_entries` and `oom.max_entries` to the same value to avoid this"
            )
        return live
