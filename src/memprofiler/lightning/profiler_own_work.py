"""memprofiler's own work among a PyTorch profiler's events, kept out of the summary table.

With ``with_stack`` the profiler's Python tracer records every Python call of every thread:
the host sampler's thread waiting on its lock (most of the "self CPU" of a small step), and
with a module tracker (``track_module_mem``, ``track_fsdp_mem``) the tracker's
``__torch_dispatch__`` around every operator, under torch's ``PythonDispatchMode`` span. The
summary table of :class:`~memprofiler.ExtendedPyTorchProfiler` leaves them out and says how
much it left out; the operators the tracker dispatches (the model's own) stay in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memprofiler.analysis.traces.events import DISPATCH_WRAPPERS

#: Files (as the Python tracer names them, relative to ``sys.path``) whose threads are
#: memprofiler's: a thread with a frame of their ``_run`` is left out whole.
OWN_THREAD_FILES = ("memprofiler/core/host_sampler.py", "memprofiler/output/mirror.py")
#: Frames of memprofiler and of the trackers it enters: left out with the Python frames they
#: call (the operators they call stay).
OWN_FILES = ("memprofiler/", "torch/distributed/_tools/", "torch/utils/module_tracker.py")
#: memprofiler's frames that call the user's code (``@memprofilable``, ``collect_funcs``): kept.
USER_CODE_WRAPPERS = ("memprofiler/core/decorator.py", "memprofiler/core/method_wrap.py")


@dataclass
class OwnWork:
    """What :func:`split_own_work` left out."""

    events: int = 0
    self_cpu_us: float = 0.0
    threads: int = 0

    def note(self) -> str:
        """One line for the summary, ``""`` when nothing was left out."""
        if not self.events:
            return ""
        threads = (
            f" (and {self.threads} thread{'s' if self.threads != 1 else ''} of its own)"
            if self.threads
            else ""
        )
        return (
            f"memprofiler's own work is left out of this table: {self.events:,} events, "
            f"{self.self_cpu_us / 1000:,.3f} ms of self CPU{threads}: its host sampler and its "
            "module tracker's dispatch (the operators the tracker dispatches are kept)"
        )


def _file(name: str) -> str:
    return name.split("(", 1)[0]


def _is(name: str, prefixes: tuple[str, ...]) -> bool:
    file = _file(name)
    return file.startswith(prefixes) or any(f"/{p}" in file for p in prefixes)


def _own_frame(ev: Any) -> bool:
    if ev.is_python_function:
        return _is(ev.name, OWN_FILES) and not _is(ev.name, USER_CODE_WRAPPERS)
    return ev.name in DISPATCH_WRAPPERS


def split_own_work(events: Sequence[Any]) -> tuple[list[Any], OwnWork]:
    """``events`` (torch ``FunctionEvent``\\ s, their ``cpu_parent`` links set) without memprofiler's
    threads and frames, and a count of what was left out.

    A frame of :data:`OWN_FILES` (or a ``PythonDispatchMode`` span) goes with every Python
    frame it calls, down to the operators: an operator (``aten::mm``, a ``record_function``
    span) and what it calls are kept, as the user's work.
    """
    own_threads = {
        ev.thread
        for ev in events
        if ev.is_python_function and _is(ev.name, OWN_THREAD_FILES) and ev.name.endswith("): _run")
    }
    memo: dict[int, bool] = {}

    def dropped(ev: Any) -> bool:
        # Walk up to the nearest own frame or operator; cache on the way back down.
        path = []
        node = ev
        verdict = False
        while node is not None:
            key = id(node)
            if key in memo:
                verdict = memo[key]
                break
            path.append(key)
            if _own_frame(node):
                verdict = True
                break
            if not node.is_python_function:
                verdict = False
                break
            node = node.cpu_parent
        for key in path:
            memo[key] = verdict
        return verdict

    kept: list[Any] = []
    out = OwnWork(threads=len(own_threads))
    for ev in events:
        if ev.thread in own_threads or dropped(ev):
            out.events += 1
            out.self_cpu_us += max(0.0, float(ev.self_cpu_time_total))
        else:
            kept.append(ev)
    return kept, out
