"""A caching allocator's history without a GPU: the estimate's allocator model hands out the
blocks, and its segments and trace come out shaped as ``torch.cuda.memory._snapshot()`` writes
them (``--cpu-dry-run``'s stand-in, and the tests' fake ``torch.cuda``)."""

from __future__ import annotations

import itertools
from typing import Any

from memprofiler.estimate.allocator.caching import SMALL_SEGMENT, AllocatorConfig, AllocatorReplay

from .history import Event


class SyntheticHistory:
    """Blocks placed by :class:`AllocatorReplay`; each new segment at a fresh 2 MiB-aligned address
    above the last (so address order is creation order, as in an estimate)."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.model = AllocatorReplay(config or AllocatorConfig(), segment_address=self._segment)
        # the estimate's log patches AllocatorReplay while it runs: a dry run's real storages,
        # freed by the garbage collector then, must not land in it
        self.model.probe_synthetic = True  # type: ignore[attr-defined]
        self.log: list[Event] = []
        self.segments: list[tuple[int, int]] = []  # (address, size)
        self.requested: dict[int, int] = {}  # live key -> requested bytes
        self.keys = itertools.count()
        self.next_base = 1 << 32

    def _segment(self, nbytes: int) -> int:
        addr = self.next_base
        self.next_base += nbytes + SMALL_SEGMENT  # a gap: segments never touch
        self.segments.append((addr, nbytes))
        self.log.append({"action": "segment_alloc", "addr": addr, "size": nbytes, "stream": 0})
        return addr

    @property
    def allocated(self) -> int:
        """``allocated_bytes``: the live blocks' sizes."""
        return self.model.allocated

    def alloc(
        self, nbytes: int, meta: str = "", frames: list[dict[str, Any]] | None = None
    ) -> tuple[int, int]:
        """Request ``nbytes`` (more than 0): its key and the block's address."""
        key = next(self.keys)
        self.model.alloc(key, nbytes)
        placed = self.model.block(key)
        assert placed is not None, "a 0-byte request has no block (the allocator makes no entry)"
        self.requested[key] = nbytes
        event = {"action": "alloc", "addr": placed[0], "size": nbytes, "stream": 0, "user_metadata": meta}
        self.log.append({**event, "frames": frames or []})
        return key, placed[0]

    def free(self, key: int, meta: str = "") -> None:
        placed = self.model.block(key)
        if placed is None:
            return
        nbytes = self.requested.pop(key)
        for act in ("free_requested", "free_completed"):
            self.log.append(
                {"action": act, "addr": placed[0], "size": nbytes, "stream": 0, "user_metadata": meta}
            )
        self.model.free(key)

    def snapshot(self) -> dict[str, Any]:
        """The segments now, and the trace from the first request."""
        live = {}
        for key, nbytes in self.requested.items():
            placed = self.model.block(key)
            if placed is not None:
                live[placed[0]] = nbytes
        layout = self.model.layout()
        segments = []
        for base, size in sorted(self.segments):
            blocks = [
                {
                    "address": a,
                    "size": s,
                    "requested_size": 0 if free else live[a],
                    "state": "inactive" if free else "active_allocated",
                }
                for a, s, free in layout
                if base <= a < base + size
            ]
            kind = "small" if size == SMALL_SEGMENT else "large"
            segments.append(
                {
                    "device": 0,
                    "address": base,
                    "total_size": size,
                    "stream": 0,
                    "segment_type": kind,
                    "blocks": blocks,
                }
            )
        return {"segments": segments, "device_traces": [list(self.log)]}
