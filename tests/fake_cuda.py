"""A fake :class:`memprofiler.cuda_backend.CudaBackend` that behaves like the caching allocator.

It replays the segments of ``fixtures/synthetic_cuda_snapshot.json`` and keeps a history
ring with the allocator's semantics, so every piece of our orchestration runs on CPU:

* ``record_memory_history("all", max_entries=N)`` starts or re-configures a ring of ``N``
  entries (the newest win); ``record_memory_history(None)`` stops and discards it;
* ``alloc`` / ``free`` append ``alloc`` / ``free_requested`` / ``free_completed`` entries
  carrying the caller's real Python frames (innermost first) while recording;
* ``snapshot()`` appends a ``snapshot`` entry while recording, as the allocator does;
* ``oom(size)`` appends an ``oom`` entry, calls the attached observers (through the real
  backend's dispatcher) and raises ``torch.OutOfMemoryError``.

Every ``record_memory_history`` call is kept in ``history_calls`` for assertions.
"""

from __future__ import annotations

import copy
import itertools
import json
import traceback
from collections import deque
from pathlib import Path
from typing import Any

import torch

from memprofiler.cuda_backend import CudaBackend, OomObserver

FIXTURE = Path(__file__).parent / "fixtures" / "synthetic_cuda_snapshot.json"
GIB = 1 << 30

_STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)


def memory_stats_keys() -> list[str]:
    """The flat key set ``torch.cuda.memory_stats()`` documents."""
    keys = [
        f"{stat}.{pool}.{kind}"
        for stat in _STAT_NAMES
        for pool in ("all", "large_pool", "small_pool")
        for kind in ("current", "peak", "allocated", "freed")
    ]
    keys += [
        f"oversize_{s}.{k}"
        for s in ("allocations", "segments")
        for k in ("current", "peak", "allocated", "freed")
    ]
    keys += [
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "max_split_size",
    ]
    return keys


def load_fixture() -> dict[str, Any]:
    data = json.loads(FIXTURE.read_text())
    data.pop("_comment", None)
    return data


class FakeCudaBackend(CudaBackend):
    """See the module docstring.

    Args:
        has_history: whether the ``_cuda_record_memory_history`` binding "exists".
        has_oom_observer: whether the OOM observer binding "exists".
        total: device memory in bytes.
    """

    def __init__(
        self, *, has_history: bool = True, has_oom_observer: bool = True, total: int = 80 * GIB
    ) -> None:
        super().__init__()
        self.available = True
        self.has_history = has_history
        self.has_oom_observer = has_oom_observer
        self.total = total
        self.fixture = load_fixture()
        self.history_calls: list[tuple[str | None, dict[str, Any]]] = []
        self.options: dict[str, Any] = {}
        self.ring: deque[dict[str, Any]] | None = None
        self.allocated = sum(s["allocated_size"] for s in self.fixture["segments"])
        self.fail_snapshot: Exception | None = None
        self.snapshots_taken = 0
        self.raw_observers: list[OomObserver] = []
        self._addr = itertools.count(0x7F3B00000000, 512)
        self._live: dict[int, int] = {}
        self._clock = itertools.count(1_732_200_000_000_000, 10)

    # ----------------------------------------------------------------- the seam
    def is_available(self) -> bool:
        return self.available

    def memory_stats(self) -> dict[str, Any]:
        stats = dict.fromkeys(memory_stats_keys(), 0)
        stats["allocated_bytes.all.current"] = self.allocated
        return stats

    def reset_peak_memory_stats(self) -> None:
        pass

    def mem_get_info(self) -> tuple[int, int]:
        return self.total - self.allocated, self.total

    def supports_history(self) -> bool:
        return self.available and self.has_history

    def record_memory_history(
        self, enabled: Any, *, context: str | None = "all", stacks: str = "python", max_entries: int = 100_000
    ) -> None:
        if not self.supports_history():
            raise AttributeError("module 'torch._C' has no attribute '_cuda_record_memory_history'")
        opts = {"context": context, "stacks": stacks, "max_entries": max_entries}
        self.history_calls.append((enabled, opts if enabled is not None else {}))
        if enabled is None:
            self.ring = None
            self.options = {}
            return
        old = list(self.ring) if self.ring is not None else []
        self.ring = deque(old, maxlen=max_entries)
        self.options = opts

    def is_history_enabled(self) -> bool | None:
        return self.ring is not None if self.has_history else None

    def snapshot(self) -> dict[str, Any]:
        if self.fail_snapshot is not None:
            raise self.fail_snapshot
        self.snapshots_taken += 1
        self._trace("snapshot", addr=0, size=self.allocated, frames=[])
        return {
            "segments": copy.deepcopy(self.fixture["segments"]),
            "device_traces": [list(self.ring) if self.ring is not None else []],
            "allocator_settings": dict(self.fixture["allocator_settings"]),
        }

    def supports_oom_observer(self) -> bool:
        return self.available and self.has_oom_observer

    def _attach_raw_oom_observer(self, dispatcher: OomObserver) -> None:
        self.raw_observers.append(dispatcher)

    # ----------------------------------------------------------------- the "device"
    def user_starts_recording(self, max_entries: int = 1000) -> None:
        """Turn recording on as a user script would, outside memprofiler."""
        self.record_memory_history("all", max_entries=max_entries)
        self.history_calls.clear()

    def alloc(self, size: int) -> int:
        addr = next(self._addr)
        self._live[addr] = size
        self.allocated += size
        self._trace("alloc", addr=addr, size=size, frames=self._frames())
        return addr

    def free(self, addr: int) -> None:
        size = self._live.pop(addr)
        self.allocated -= size
        frames = self._frames() if self.options.get("context") == "all" else []
        self._trace("free_requested", addr=addr, size=size, frames=frames)
        self._trace("free_completed", addr=addr, size=size, frames=frames)

    def oom(self, size: int) -> None:
        """Fail an allocation of ``size`` bytes the way the caching allocator does."""
        free, total = self.mem_get_info()
        self._trace("oom", device_free=free, size=size, frames=self._frames())
        for observer in list(self.raw_observers):
            observer(0, size, total, free)
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes.")

    def _frames(self) -> list[dict[str, Any]]:
        if self.options.get("context") in (None, "state"):
            return []
        stack = traceback.extract_stack()[:-2]
        return [{"filename": f.filename, "line": f.lineno or 0, "name": f.name} for f in reversed(stack)]

    def _trace(self, action: str, **fields: Any) -> None:
        if self.ring is not None:
            self.ring.append({"action": action, "stream": 0, "time_us": next(self._clock), **fields})

    def actions(self, snap: dict[str, Any]) -> list[str]:
        return [e["action"] for e in snap["device_traces"][0]]
