"""The OOM flight recorder: a bounded allocator-history ring, dumped when training dies.

While enabled, allocator history is recorded for the whole run into a ring of
``oom.max_entries`` events. On a CUDA out-of-memory (the allocator's observer, called just
before the OOM error is raised) and again when training ends in an exception (Lightning's
``on_exception``, or leaving ``with MemProfiler(...)`` by an exception) it writes:

* ``oom_rank_{rank}_{n}.pickle``: the allocator snapshot, for pytorch.org/memory_viz;
* ``oom_rank_{rank}_{n}.yaml``: why, ``torch.cuda.memory_stats()`` of the device that ran
  out, its free and total bytes, the allocation that failed (``failed_alloc_bytes``: the
  cudaMalloc the allocator attempted, at least 2 MiB; ``requested_bytes``: the block the
  tensor asked for, from the history's ``oom`` entry), the step and call counts, and the
  consolidated snapshots collected so far;
* ``oom_rank_{rank}_{n}.json``: the role map of the model's parameters, gradients, optimizer
  state and buffers as they were when the record was written (:mod:`block_roles`, in the window
  index's format), so readers name the blocks alive at the OOM by role and tensor, as they do
  for a window's recording.

Out-of-memory errors that PyTorch catches and recovers from (cuDNN's algorithm search tries
workspaces until one fits) reach the observer too; ``oom.max_dumps`` bounds how many such
records one run writes.

``n`` counts up from the first number not already on disk, so nothing earlier is
overwritten. Nothing here may raise into the allocator: a fault while writing a record is
reported as a warning and the OOM stays the OOM it was.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from memprofiler import layout
from memprofiler.collectors.base import BaseCollector, ProfilerView, Warn
from memprofiler.collectors.block_roles import role_map
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.collectors.history_recording import HistoryOptions, HistoryRecording
from memprofiler.errors import log
from memprofiler.output.writers import write_json, write_pickle, write_yaml

#: Holder name of the flight recorder's ring in :class:`HistoryRecording`.
RING_HOLDER = "oom"
#: Format version of the role map beside a record (the window index's version 2 fields, and
#: ``roles_at: end``: the map was taken when the recording ended).
ROLES_VERSION = 2


class OomRecorder(BaseCollector):
    """Keeps the ring and writes OOM / crash records. Collects no per-call metrics.

    Args:
        backend: the CUDA seam.
        recording: the shared recording owner; ``None`` when history cannot be recorded
            here (records then carry stats but no history).
        options: ring size and stack options.
        max_dumps: records written per run at most.
        warn: reports a missing capability (once, on rank zero).
    """

    name = "oom"

    def __init__(
        self,
        backend: CudaBackend,
        recording: HistoryRecording | None,
        options: HistoryOptions,
        max_dumps: int,
        warn: Warn,
    ) -> None:
        self._backend = backend
        self._recording = recording
        self._options = options
        self._max_dumps = max_dumps
        self._warn = warn
        self._profiler: ProfilerView | None = None
        self._remove_observer: Callable[[], None] | None = None
        self._next_n = 0
        self._dumps = 0
        self._last_oom: dict[str, int] | None = None
        self._active = False
        self._lock = threading.RLock()
        if recording is not None:
            recording.plan(options)

    def bind(self, view: ProfilerView) -> None:
        """Start the ring and attach the OOM observer; called once at set-up."""
        self._profiler = view
        self._active = True
        if self._recording is not None:
            self._recording.acquire(RING_HOLDER, self._options)
        no_observer = self._backend.oom_observer_unsupported_reason()
        if no_observer is None:
            self._remove_observer = self._backend.add_oom_observer(self._on_oom)
        else:
            self._warn(
                f"no CUDA out-of-memory observer can be attached ({no_observer}); OOM records are "
                "written from the exception handler only"
            )

    def crash(self, exc: BaseException) -> list[Path]:
        """Write a record for an exception that ends training, then stop the ring."""
        info: dict[str, Any] = {"reason": "exception", "exception": f"{type(exc).__name__}: {exc}"}
        if self._last_oom is not None and _is_cuda_oom(exc):
            info.update(self._last_oom)
        written = self._record_safely(info)
        self.close()
        return written

    def close(self) -> None:
        self._active = False
        if self._remove_observer is not None:
            self._remove_observer()
            self._remove_observer = None
        if self._recording is not None:
            self._recording.release(RING_HOLDER)

    # ------------------------------------------------------------------ records
    def _on_oom(self, device: int, alloc: int, limit: int, device_free: int) -> None:
        # Called by the allocator with the GIL held, before it raises the OOM error. Its third
        # argument is the device's total memory, or the allowed maximum when
        # `torch.cuda.set_per_process_memory_fraction` is in effect, so the record keeps it as
        # the allocator's limit and asks the driver for the true total.
        oom = {
            "device": device,
            "failed_alloc_bytes": alloc,
            "allocator_limit_bytes": limit,
            "device_free_bytes": device_free,
        }
        with self._lock:  # a crash record must not pick up another thread's OOM half-way
            self._last_oom = oom
            self._record_safely({"reason": "cuda_oom", **oom})

    def _record_safely(self, info: dict[str, Any]) -> list[Path]:
        if not self._active:
            return []
        try:
            return self._record(info)
        except Exception as err:
            log.debug("OOM record failed", exc_info=True)
            # Every rank: a rank that failed to write its record must say so itself.
            self._warn(
                f"could not write the OOM record ({err!r}); training's own error is unchanged",
                all_ranks=True,
            )
            return []

    def _record(self, info: dict[str, Any]) -> list[Path]:
        prof = self._profiler
        if prof is None:
            raise RuntimeError("OOM recorder used before the profiler bound it")
        with self._lock:  # two device threads can run out of memory at once
            return self._record_locked(prof, info)

    def _record_locked(self, prof: ProfilerView, info: dict[str, Any]) -> list[Path]:
        if self._dumps >= self._max_dumps:
            self._warn(f"{self._max_dumps} OOM records written (`oom.max_dumps`); later ones are skipped")
            return []
        n = self._claim_number(prof.save_dir, prof.rank)
        self._dumps += 1
        written: list[Path] = []
        record: dict[str, Any] = {
            "rank": prof.rank,
            "n": n,
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **info,
            "step": prof.current_step(),
            "calls": dict(sorted(prof.call_counts().items())),
        }
        record.setdefault("failed_alloc_bytes", None)
        # Each part is taken on its own so that one failing still leaves the others.
        device = info.get("device")  # the observer's; the current device after an exception
        snap: dict[str, Any] | None = None
        try:
            snap = self._backend.snapshot()
            pickle_name = layout.OOM_PICKLE.format(rank=prof.rank, n=n)
            written.append(write_pickle(prof.save_dir / pickle_name, snap, plain=False))
            record["pickle"] = pickle_name
            record["trace_entries"] = sum(len(t) for t in snap.get("device_traces", ()))
            if "failed_alloc_bytes" in info:  # an observed OOM, and the crash record after it
                record["requested_bytes"] = _last_oom_size(snap, device)
        except Exception as err:
            record["pickle"] = None
            record["pickle_error"] = repr(err)
        if record["pickle"] is not None and snap is not None:
            try:
                roles_name = layout.OOM_ROLES.format(rank=prof.rank, n=n)
                roles = self._roles_file(prof, n, record["pickle"], snap)
                written.append(write_json(prof.save_dir / roles_name, roles))
                record["roles"] = roles_name
            except Exception as err:
                record["roles"] = None
                record["roles_error"] = repr(err)
        try:
            free, total = self._backend.mem_get_info(device)
            record.setdefault("device_free_bytes", free)  # the observer's figure is the OOM's own
            record["device_total_bytes"] = total
        except Exception as err:
            record["mem_get_info_error"] = repr(err)
            record.setdefault("device_total_bytes", None)  # the allocator's limit is not the total
        try:
            record["memory_stats"] = self._backend.memory_stats(device)
        except Exception as err:
            record["memory_stats_error"] = repr(err)
        record["snapshots"] = dict(prof.snapshots)
        written.append(write_yaml(prof.save_dir / layout.OOM_YAML.format(rank=prof.rank, n=n), record))
        return written

    def _roles_file(
        self, prof: ProfilerView, n: int, pickle_name: str, snap: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The role map of the storages alive now, tied to the pickle as a window's index is."""
        return {
            "format": layout.CUDA_ALLOC_WINDOW_FORMAT,
            "version": ROLES_VERSION,
            "rank": prof.rank,
            "oom": n,
            "pickle": pickle_name,
            "run_id": getattr(prof, "run_id", None),
            "trace_entries": sum(len(t) for t in snap.get("device_traces", ())),
            "digest": layout.recording_digest(snap),
            "calls": [],
            "roles_at": "end",
            "roles": role_map(prof.module, prof.optimizers),  # the bound or attached model
        }

    def _claim_number(self, save_dir: Path, rank: int) -> int:
        n = self._next_n
        while (save_dir / layout.OOM_YAML.format(rank=rank, n=n)).exists() or (
            save_dir / layout.OOM_PICKLE.format(rank=rank, n=n)
        ).exists():
            n += 1
        self._next_n = n + 1
        return n


def _last_oom_size(snap: Mapping[str, Any], device: int | None) -> int | None:
    """Size of the newest ``oom`` entry in ``device``'s history: the block the tensor asked for
    (rounded to 512 B), where the observer's figure is the whole cudaMalloc that failed."""
    traces = snap.get("device_traces") or []
    if device is None or not 0 <= device < len(traces):
        return None
    for entry in reversed(traces[device]):
        if entry.get("action") == "oom":
            return int(entry.get("size", 0))
    return None


def _is_cuda_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
