"""A fake :class:`memprofiler.collectors.cuda_backend.CudaBackend` that behaves like the caching allocator.

It replays the segments of ``fixtures/synthetic_cuda_snapshot.json`` and keeps a history
ring with the allocator's semantics, so every piece of our orchestration runs on CPU:

* ``record_memory_history("all", max_entries=N)`` starts or re-configures the history ring
  with the allocator's own ``RingBuffer`` semantics (see :class:`AllocatorRing`): a new
  ``max_entries`` on a live ring neither truncates nor reorders what is stored, so resizing a
  ring that has wrapped scrambles its order, exactly as on a device;
  ``record_memory_history(None)`` stops and clears it;
* ``alloc`` / ``free`` append ``alloc`` / ``free_requested`` / ``free_completed`` entries
  carrying the caller's real Python frames (innermost first) while recording;
* ``snapshot()`` copies the ring and only then appends a ``snapshot`` entry while recording,
  as ``NativeCachingAllocator::snapshot`` does (``trace()`` before ``snapshot()``): a pickle
  never holds its own marker, only those of earlier snapshots;
* ``oom(size)`` appends an ``oom`` entry, calls the attached observers (through the real
  backend's dispatcher) and raises ``torch.OutOfMemoryError``;
* ``mark_start(name)`` / ``mark_end(handle)`` append ``START`` / ``END`` entries to
  ``external_annotations`` on the same clock as the trace while recording, as the allocator
  does for a user-scope ``record_function``; ``record_memory_history(None)`` clears them.
* with ``track_blocks=True`` its allocations live in one 1 GiB segment of their own (bump
  allocated, 512-byte rounded), and ``snapshot()`` lists it with the live blocks, their
  allocation frames and the free gaps, so a snapshot's end state matches its trace.

Every ``record_memory_history`` call is kept in ``history_calls`` for assertions.

It also has CUDA's initialisation state (``initialized``; ``FakeCudaBackend(initialized=False)``
is a fresh process before its first CUDA tensor). Calling a private binding then fails as the
real one may: :class:`SimulatedCrash` (a ``BaseException``, which no collector guard catches,
like the segmentation fault of ``torch._C._cuda_isHistoryEnabled()`` before init). ``alloc``,
``reset_peak_memory_stats``, ``mem_get_info`` and ``ensure_initialized`` initialise it, as a
CUDA tensor, ``current_device()`` and ``torch.cuda.init()`` do.
"""

from __future__ import annotations

import copy
import itertools
import json
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from memprofiler.collectors.cuda_backend import CudaBackend, OomObserver
from memprofiler.units import CUDA_MEMORY_STATS

FIXTURE = Path(__file__).parent / "fixtures" / "synthetic_cuda_snapshot.json"
GIB = 1 << 30
#: Where the fake's own allocations live (one segment of ``SEGMENT_SIZE`` with ``track_blocks``).
SEGMENT_ADDR = 0x7F3B00000000
SEGMENT_SIZE = GIB


def round_size(size: int) -> int:
    """The caching allocator's smallest rounding: a multiple of 512 bytes, at least 512."""
    return max(512, -(-size // 512) * 512)


class SimulatedCrash(BaseException):
    """What the real process would die of (exit 139): a private binding called before init."""


def memory_stats_keys() -> list[str]:
    """The flat key set ``torch.cuda.memory_stats()`` documents."""
    return list(CUDA_MEMORY_STATS)


_ZERO_STATS: dict[str, Any] = dict.fromkeys(CUDA_MEMORY_STATS, 0)


def load_fixture() -> dict[str, Any]:
    data = json.loads(FIXTURE.read_text())
    data.pop("_comment", None)
    return data


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the cudaMalloc the allocator attempts for a block of ``size``,
    which is what its out-of-memory observers are handed."""
    mib = 1 << 20
    if size <= mib:
        return 2 * mib
    if size < 10 * mib:
        return 20 * mib
    return -(-size // (2 * mib)) * (2 * mib)


class AllocatorRing:
    """The caching allocator's ``c10::RingBuffer``: a vector plus the index of the oldest entry.

    ``set_max_entries`` only moves the bound. Entries already stored stay where they are, so
    a ring that has wrapped and then grows appends new entries in the middle of the
    oldest-first order, and one that shrinks keeps its extra entries (and, once its write
    position is past the new bound, c10 writes out of bounds; this fake raises IndexError).
    memprofiler must never resize a live ring; this fake makes a violation visible.
    """

    def __init__(self, max_entries: int) -> None:
        self._entries: list[dict[str, Any]] = []
        self._next = 0
        self.max_entries = max(1, max_entries)

    def set_max_entries(self, max_entries: int) -> None:
        self.max_entries = max(1, max_entries)

    def append(self, entry: dict[str, Any]) -> None:
        if len(self._entries) < self.max_entries:
            self._entries.append(entry)
            return
        self._entries[self._next] = entry
        self._next += 1
        if self._next == self.max_entries:
            self._next = 0

    def entries(self) -> list[dict[str, Any]]:
        """Oldest first, read the way ``RingBuffer::getEntries`` reads them."""
        return self._entries[self._next :] + self._entries[: self._next]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.entries())


class FakeCudaBackend(CudaBackend):
    """See the module docstring.

    Args:
        has_history: whether the ``_cuda_record_memory_history`` binding "exists".
        has_oom_observer: whether the OOM observer binding "exists".
        total: device memory in bytes.
        initialized: whether CUDA is already initialised (the model is on the device, as under
            Lightning); ``False`` is a fresh process before its first CUDA tensor.
    """

    def __init__(
        self,
        *,
        has_history: bool = True,
        has_oom_observer: bool = True,
        total: int = 80 * GIB,
        initialized: bool = True,
        track_blocks: bool = False,
    ) -> None:
        super().__init__()
        self.available = True
        self.initialized = initialized
        #: Raised by ``torch.cuda.init()`` when set (e.g. a child forked from an initialised parent).
        self.init_error: Exception | None = None
        #: ``torch.cuda.init()`` calls that initialised CUDA.
        self.inits = 0
        #: ``PYTORCH_CUDA_ALLOC_CONF=backend:...``; only ``native`` records history or observes OOMs.
        self.allocator = "native"
        #: The ``device`` argument of every ``memory_stats`` / ``mem_get_info`` call.
        self.devices_asked: list[int | None] = []
        self.has_history = has_history
        self.has_oom_observer = has_oom_observer
        self.total = total
        self.fixture = load_fixture()
        self.history_calls: list[tuple[str | None, dict[str, Any]]] = []
        self.options: dict[str, Any] = {}
        self.ring: AllocatorRing | None = None
        self.allocated = sum(s["allocated_size"] for s in self.fixture["segments"])
        #: Highest ``allocated`` since the last ``reset_peak_memory_stats``; resets counted.
        self.peak = self.allocated
        self.resets = 0
        self.fail_snapshot: Exception | None = None
        self.snapshots_taken = 0
        self.raw_observers: list[OomObserver] = []
        self._next_addr = SEGMENT_ADDR
        self.track_blocks = track_blocks
        #: ``external_annotations`` recorded so far (cleared when recording stops).
        self.annotations: list[dict[str, Any]] = []
        #: Every ``mark_start`` name, recorded or not.
        self.marks: list[str] = []
        #: Blocks that play memory allocated before any recording: address -> bytes.
        self.adopted: dict[int, int] = {}
        self._live: dict[int, tuple[int, list[dict[str, Any]] | None]] = {}
        self._clock = itertools.count(1_732_200_000_000_000, 10)

    # ----------------------------------------------------------------- the seam
    def is_available(self) -> bool:
        return self.available

    def is_initialized(self) -> bool:
        return self.initialized

    def _init(self) -> None:
        if not self.available:
            raise RuntimeError("No CUDA GPUs are available")
        if self.init_error is not None:
            raise self.init_error
        if not self.initialized:
            self.initialized = True
            self.inits += 1

    def _too_early(self, binding: str) -> None:
        if not self.initialized:
            raise SimulatedCrash(f"torch._C.{binding}() before CUDA is initialised: segmentation fault")

    def memory_stats(self, device: int | None = None) -> dict[str, Any]:
        self.devices_asked.append(device)
        if not self.initialized:
            return {}  # torch.cuda.memory_stats before init
        stats = _ZERO_STATS.copy()
        stats["allocated_bytes.all.current"] = self.allocated
        stats["allocated_bytes.all.peak"] = max(self.peak, self.allocated)
        return stats

    def reset_peak_memory_stats(self) -> None:
        self._init()  # current_device() initialises CUDA
        self.resets += 1
        self.peak = self.allocated

    def mem_get_info(self, device: int | None = None) -> tuple[int, int]:
        self.devices_asked.append(device)
        self._init()
        return self.total - self.allocated, self.total

    def allocator_backend(self) -> str | None:
        return self.allocator

    def history_unsupported_reason(self) -> str | None:
        if not self.available:
            return "no CUDA device"
        if not self.initialized:
            return "CUDA is not initialised"
        if not self.has_history:
            return "this torch build lacks `torch._C._cuda_record_memory_history`"
        return None if self.allocator == "native" else f"the `{self.allocator}` CUDA allocator has no history"

    def record_memory_history(
        self, enabled: Any, *, context: str | None = "all", stacks: str = "python", max_entries: int = 100_000
    ) -> None:
        self._too_early("_cuda_record_memory_history")
        if not self.supports_history():
            raise AttributeError("module 'torch._C' has no attribute '_cuda_record_memory_history'")
        opts = {"context": context, "stacks": stacks, "max_entries": max_entries}
        self.history_calls.append((enabled, opts if enabled is not None else {}))
        if enabled is None:
            self.ring = None
            self.options = {}
            self.annotations = []
            return
        if self.ring is None:
            self.ring = AllocatorRing(max_entries)
        else:
            self.ring.set_max_entries(max_entries)
        self.options = opts

    def is_history_enabled(self) -> bool | None:
        if not self.has_history:
            return None
        self._too_early("_cuda_isHistoryEnabled")
        return self.ring is not None

    def snapshot(self) -> dict[str, Any]:
        self._too_early("_cuda_memorySnapshot")
        if self.fail_snapshot is not None:
            raise self.fail_snapshot
        self.snapshots_taken += 1
        snap = {
            "segments": copy.deepcopy(self.fixture["segments"]) + self._own_segment(),
            "device_traces": [self.ring.entries() if self.ring is not None else []],
            "allocator_settings": dict(self.fixture["allocator_settings"]),
            "external_annotations": [dict(a) for a in self.annotations],
        }
        self._trace("snapshot", addr=0, size=self.allocated)
        return snap

    def adopt(self, addr: int, size: int) -> None:
        """Play a block of ``size`` bytes at ``addr`` allocated before any recording (no trace
        entry, no stack), such as a parameter's storage; ``snapshot()`` lists it in a segment
        of its own."""
        self.adopted[addr] = size

    def _adopted_segments(self) -> list[dict[str, Any]]:
        out = []
        for addr, size in sorted(self.adopted.items()):
            rounded = round_size(size)
            block = {
                "address": addr,
                "size": rounded,
                "requested_size": size,
                "state": "active_allocated",
                "frames": [],
            }
            out.append(
                {
                    "device": 0,
                    "address": addr,
                    "total_size": rounded,
                    "allocated_size": rounded,
                    "active_size": rounded,
                    "requested_size": size,
                    "stream": 0,
                    "segment_type": "small",
                    "blocks": [block],
                }
            )
        return out

    def _own_segment(self) -> list[dict[str, Any]]:
        if not self.track_blocks:
            return self._adopted_segments()
        blocks: list[dict[str, Any]] = []
        pos = SEGMENT_ADDR
        for addr in sorted(self._live):
            size, frames = self._live[addr]
            if addr > pos:
                blocks.append({"address": pos, "size": addr - pos, "requested_size": 0, "state": "inactive"})
            blocks.append(
                {
                    "address": addr,
                    "size": round_size(size),
                    "requested_size": size,
                    "state": "active_allocated",
                    "frames": copy.deepcopy(frames) if frames is not None else [],
                }
            )
            pos = addr + round_size(size)
        if pos < SEGMENT_ADDR + SEGMENT_SIZE:
            blocks.append(
                {
                    "address": pos,
                    "size": SEGMENT_ADDR + SEGMENT_SIZE - pos,
                    "requested_size": 0,
                    "state": "inactive",
                }
            )
        live = [b for b in blocks if b["state"] != "inactive"]
        return [
            *self._adopted_segments(),
            {
                "device": 0,
                "address": SEGMENT_ADDR,
                "total_size": SEGMENT_SIZE,
                "allocated_size": sum(b["size"] for b in live),
                "active_size": sum(b["size"] for b in live),
                "requested_size": sum(b["requested_size"] for b in live),
                "stream": 0,
                "segment_type": "large",
                "blocks": blocks,
            },
        ]

    def mark_start(self, name: str) -> Any:
        self.marks.append(name)
        self._annotate("START", name)
        return name

    def mark_end(self, handle: Any) -> None:
        self._annotate("END", str(handle))

    def _annotate(self, stage: str, name: str) -> None:
        if self.ring is not None:
            self.annotations.append({"stage": stage, "name": name, "device": 0, "time_us": next(self._clock)})
            del self.annotations[: -self.ring.max_entries]  # a ring of the history's size, as torch keeps

    def oom_observer_unsupported_reason(self) -> str | None:
        if not self.available:
            return "no CUDA device"
        if not self.initialized:
            return "CUDA is not initialised"
        if not self.has_oom_observer:
            return "this torch build lacks `torch._C._cuda_attach_out_of_memory_observer`"
        return (
            None if self.allocator == "native" else f"the `{self.allocator}` CUDA allocator has no observer"
        )

    def _attach_raw_oom_observer(self, dispatcher: OomObserver) -> None:
        self._too_early("_cuda_attach_out_of_memory_observer")
        self.raw_observers.append(dispatcher)

    # ----------------------------------------------------------------- the "device"
    def user_starts_recording(self, max_entries: int = 1000) -> None:
        """Turn recording on as a user script would, outside memprofiler."""
        self.record_memory_history("all", max_entries=max_entries)
        self.history_calls.clear()

    def alloc(self, size: int) -> int:
        self._init()  # the first CUDA tensor initialises CUDA
        addr = self._next_addr
        self._next_addr += round_size(size)
        frames = self._frames()
        self._live[addr] = (size, frames)
        self.allocated += size
        self.peak = max(self.peak, self.allocated)
        self._trace("alloc", addr=addr, size=size, frames=frames)
        return addr

    def alloc_at(self, addr: int, size: int) -> None:
        """Record an allocation at ``addr``, such as a parameter's storage moved to the device
        after recording began; ``free`` releases it."""
        frames = self._frames()
        self._live[addr] = (size, frames)
        self.allocated += size
        self._trace("alloc", addr=addr, size=size, frames=frames)

    def free(self, addr: int) -> None:
        size, alloc_frames = self._live.pop(addr)
        self.allocated -= size
        # context "all" records the free's own stack; "alloc" repeats the allocation's
        frames = self._frames() if self.options.get("context") == "all" else alloc_frames
        self._trace("free_requested", addr=addr, size=size, frames=frames)
        self._trace("free_completed", addr=addr, size=size, frames=frames)

    def oom(self, size: int, *, limit: int | None = None, device: int = 0) -> None:
        """Fail an allocation of ``size`` bytes the way the caching allocator does.

        ``limit`` plays ``torch.cuda.set_per_process_memory_fraction``: the observers then get
        the allowed maximum in place of the device total, as the allocator passes it.
        """
        free, total = self.total - self.allocated, self.total
        block = -(-size // 512) * 512  # the allocator's round_size: the `oom` entry's size
        self._trace("oom", device_free=free, size=block, frames=self._frames())
        for observer in list(self.raw_observers):
            observer(device, allocation_size(block), total if limit is None else limit, free)
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes.")

    def _frames(self) -> list[dict[str, Any]] | None:
        """The caller's frames, innermost first; ``None`` (no ``frames`` key) unless
        ``context`` is ``alloc`` or ``all``, as ``record_trace`` keeps no context then."""
        if self.options.get("context") in (None, "state"):
            return None
        stack = traceback.extract_stack()[:-2]
        return [{"filename": f.filename, "line": f.lineno or 0, "name": f.name} for f in reversed(stack)]

    def _trace(self, action: str, **fields: Any) -> None:
        if fields.get("frames", ...) is None:
            del fields["frames"]  # the binding writes `frames` only for an entry with a context
        if self.ring is not None:
            self.ring.append({"action": action, "stream": 0, "time_us": next(self._clock), **fields})

    def actions(self, snap: dict[str, Any]) -> list[str]:
        return [e["action"] for e in snap["device_traces"][0]]


def no_gpu() -> FakeCudaBackend:
    """The CUDA seam of a machine without a GPU: for tests of CPU behaviour that must give the
    same figures on a GPU node, where another test of the process may have initialised CUDA."""
    backend = FakeCudaBackend(initialized=False)
    backend.available = False
    return backend
