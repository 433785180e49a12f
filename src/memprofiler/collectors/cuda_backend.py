"""The one narrow seam between memprofiler and ``torch.cuda``.

Every CUDA call the profiler makes goes through a :class:`CudaBackend`. Tests replace it
with a fake that replays recorded data, so all of our orchestration runs on CPU-only
machines; on a GPU the real backend forwards to ``torch.cuda``.

The CPU build of torch has ``torch.cuda.memory`` but lacks the C bindings behind
allocator-history recording and the out-of-memory observer, so each of those is probed with
``hasattr`` before use rather than assumed from ``torch.cuda.is_available()``.

What each call into torch needs (an audit of every CUDA call memprofiler makes; "init" is
``torch.cuda.is_initialized()``). A private binding called too early can kill the process
(``_cuda_isHistoryEnabled`` before init is a segmentation fault, exit 139), so the backend
never calls one before init: it raises :class:`CudaNotInitialized` (an ``Exception``, which
the collector guard turns into one warning) or answers "cannot tell", and the collectors
that need CUDA call :meth:`CudaBackend.ensure_initialized` at set-up, before any of them.

* ``torch.cuda.is_available()``: nothing; never initialises CUDA.
* ``torch.cuda.is_initialized()``: nothing.
* ``torch.cuda.init()``: a visible device; raises without one, or in a child forked from an
  initialised parent.
* ``torch.cuda.memory_stats(device)``: nothing; ``{}`` before init (torch checks).
* ``torch.cuda.reset_peak_memory_stats()``: a current device; initialises CUDA itself
  (``current_device()``).
* ``torch.cuda.mem_get_info(device)``: a current device; initialises CUDA itself.
* ``torch.cuda.current_device()`` (``core/summary_exchange.py``): initialises CUDA itself.
* ``torch.cuda.memory.get_allocator_backend()`` (``torch._C._cuda_getAllocatorBackend``):
  init; asked only after it.
* ``torch.cuda.memory._record_memory_history(...)`` (``torch._C._cuda_record_memory_history``):
  init; torch does not initialise CUDA for it (it goes straight to the binding).
* ``torch._C._cuda_isHistoryEnabled()``: init; a segmentation fault before.
* ``torch.cuda.memory._snapshot()`` (``torch._C._cuda_memorySnapshot``): init, and history
  enabled for ``device_traces`` to hold anything.
* ``torch._C._cuda_attach_out_of_memory_observer(fn)``: init (older torch crashes before it,
  pytorch#107330).
* ``torch._C._autograd._get_sequence_nr`` (``collectors/saved_tensors.py``): nothing CUDA.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal

import torch

from memprofiler.errors import log

#: ``observer(device, alloc_bytes, limit_bytes, device_free_bytes)``, the argument order of
#: the CUDA caching allocator's out-of-memory observers. ``limit_bytes`` is the device total,
#: or the allowed maximum under ``torch.cuda.set_per_process_memory_fraction``.
OomObserver = Callable[[int, int, int, int], None]


class CudaNotInitialized(RuntimeError):
    """A private CUDA binding was about to be called before CUDA was initialised."""

    def __init__(self, binding: str) -> None:
        super().__init__(
            f"`torch._C.{binding}` needs CUDA initialised and it is not; memprofiler did not call it"
        )


class CudaBackend:
    """Forwards to ``torch.cuda``. Subclass or duck-type it to fake a device in tests."""

    def __init__(self) -> None:
        self._oom_observers: list[OomObserver] = []
        self._oom_attached = False
        self._lock = threading.Lock()

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def is_initialized(self) -> bool:
        """Whether CUDA is initialised in this process (never initialises it)."""
        return torch.cuda.is_initialized()

    def _init(self) -> None:
        torch.cuda.init()

    def ensure_initialized(self) -> str | None:
        """Initialise CUDA unless it is already; ``None`` when it is then, else why not.

        Called at set-up by the collectors that need private bindings (allocator history,
        the OOM recorder), whatever the order of set-up and model placement: before the
        first CUDA tensor (a plain loop, Fabric before ``setup``) as after it (Lightning).
        """
        if self.is_initialized():
            return None
        if not self.is_available():
            return "no CUDA device"
        try:
            self._init()
        except Exception as err:
            return f"torch.cuda.init() failed: {err}"
        return None if self.is_initialized() else "torch.cuda.init() left CUDA uninitialised"

    def _require_initialized(self, binding: str) -> None:
        if not self.is_initialized():
            raise CudaNotInitialized(binding)

    def memory_stats(self, device: int | None = None) -> dict[str, Any]:
        """``torch.cuda.memory_stats`` of ``device`` (the current one by default); ``{}``
        before CUDA is initialised."""
        return dict(torch.cuda.memory_stats(device))

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def mem_get_info(self, device: int | None = None) -> tuple[int, int]:
        """``(free, total)`` bytes of ``device`` (the current one by default), from the driver."""
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)

    def allocator_backend(self) -> str | None:
        """``native`` or ``cudaMallocAsync`` (``PYTORCH_CUDA_ALLOC_CONF=backend:...``); ``None``
        when torch cannot tell (no CUDA binding)."""
        if not self.is_initialized():
            return None
        try:
            return str(torch.cuda.memory.get_allocator_backend())
        except Exception:
            return None

    def _unsupported(self, binding: str, what: str) -> str | None:
        if not self.is_available():
            return "no CUDA device"
        if not self.is_initialized():
            return "CUDA is not initialised"
        if not hasattr(torch._C, binding):
            return f"this torch build lacks `torch._C.{binding}`"
        backend = self.allocator_backend()
        if backend not in (None, "native"):
            # Other allocators' bindings exist but raise "does not yet support ...".
            return f"the `{backend}` CUDA allocator has no {what}; only the `native` caching allocator has"
        return None

    # ------------------------------------------------------------ allocator history
    def history_unsupported_reason(self) -> str | None:
        """Why allocator-history recording cannot run here, or ``None`` when it can."""
        return self._unsupported("_cuda_record_memory_history", "allocator-history recording")

    def supports_history(self) -> bool:
        """Whether allocator-history recording can run here."""
        return self.history_unsupported_reason() is None

    def record_memory_history(
        self,
        enabled: Literal["state", "all"] | None,
        *,
        context: str | None = "all",
        stacks: str = "python",
        max_entries: int = 100_000,
    ) -> None:
        """Start (``enabled="all"``), re-configure, or stop (``enabled=None``) recording.

        Stopping discards the recorded history, as the allocator does.

        Raises:
            CudaNotInitialized: before CUDA is initialised (nothing is called).
        """
        self._require_initialized("_cuda_record_memory_history")
        if enabled is None:
            torch.cuda.memory._record_memory_history(enabled=None)
        else:
            torch.cuda.memory._record_memory_history(
                enabled=enabled, context=context, stacks=stacks, max_entries=max_entries
            )

    def is_history_enabled(self) -> bool | None:
        """Whether any recording is on (ours or the user's); ``None`` when torch cannot tell,
        which includes before CUDA is initialised (the binding is a segmentation fault then)."""
        probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        if probe is None or not self.is_available() or not self.is_initialized():
            return None
        return bool(probe())

    def snapshot(self) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()``: segments plus the recorded ``device_traces``.

        Raises:
            CudaNotInitialized: before CUDA is initialised (nothing is called).
        """
        self._require_initialized("_cuda_memorySnapshot")
        return dict(torch.cuda.memory._snapshot())

    # ------------------------------------------------------------ call marks
    def mark_start(self, name: str) -> Any:
        """Open a user-scope ``record_function`` named ``name``; return its handle.

        While history is recorded the caching allocator keeps every user-scope record
        function's start and end, with the time of its own trace clock, in the snapshot's
        ``external_annotations`` (``{"stage": "START", "name", "device", "time_us"}``): one
        annotation marks a point of the recording without copying it. Profilers see the same
        span. Close it with :meth:`mark_end`, also when the code between raised.
        """
        return torch.ops.profiler._record_function_enter_new(name, None)

    def mark_end(self, handle: Any) -> None:
        """Close a span opened by :meth:`mark_start` (its ``END`` annotation)."""
        with torch._C.DisableTorchFunctionSubclass():
            torch.ops.profiler._record_function_exit._RecordFunction(handle)

    # ------------------------------------------------------------ OOM observer
    def oom_observer_unsupported_reason(self) -> str | None:
        """Why no out-of-memory observer can be attached here, or ``None`` when one can."""
        return self._unsupported("_cuda_attach_out_of_memory_observer", "out-of-memory observer")

    def supports_oom_observer(self) -> bool:
        return self.oom_observer_unsupported_reason() is None

    def add_oom_observer(self, observer: OomObserver) -> Callable[[], None]:
        """Call ``observer`` on every CUDA out-of-memory; return a function that removes it.

        The allocator cannot detach an observer, so one dispatcher is attached per backend,
        the first time it is needed, and our observers come and go behind it. Each observer
        runs guarded: an exception in one never reaches the allocator, so an OOM stays an
        OOM.
        """
        with self._lock:
            self._oom_observers.append(observer)
            if not self._oom_attached:
                self._attach_raw_oom_observer(self._dispatch_oom)
                self._oom_attached = True

        def remove() -> None:
            with self._lock:
                if observer in self._oom_observers:
                    self._oom_observers.remove(observer)

        return remove

    def _attach_raw_oom_observer(self, dispatcher: OomObserver) -> None:
        """Attach ``dispatcher`` to the allocator, for good (it cannot be detached)."""
        # Older torch builds crash attaching before the allocator exists (pytorch#107330).
        self._init()
        self._require_initialized("_cuda_attach_out_of_memory_observer")
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer")  # noqa: B009
        attach(dispatcher)

    def _dispatch_oom(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        for observer in list(self._oom_observers):
            try:
                observer(int(device), int(alloc), int(device_total), int(device_free))
            except Exception:  # last line of defence; observers report their own faults
                log.debug("OOM observer %r failed", observer, exc_info=True)


_default: CudaBackend | None = None


def default_backend() -> CudaBackend:
    """The process-wide real backend."""
    global _default
    if _default is None:
        _default = CudaBackend()
    return _default
