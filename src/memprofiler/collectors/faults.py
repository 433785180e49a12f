"""One guard for memprofiler code that runs inside the user's training step.

The profiler guards every collector event (``core.dispatch.CollectorSet``), but hooks
run later, from inside the user's forward: module hooks, the user's ``memory_hooks``, the
saved-tensor pack hook. An exception there would end the training run. Each such part asks
its :class:`HookFaults` whether it is still on, and reports an exception to it: the part is
switched off for the rest of the run with one warning naming it, and training goes on.
"""

from __future__ import annotations

from memprofiler.collectors.base import Warn
from memprofiler.errors import log


class HookFaults:
    """Which hook-driven parts failed; warns once per part.

    Args:
        warn: the profiler's warn-once function (``MemProfiler.warn``).

    Example:
        >>> faults = HookFaults(lambda message: None)
        >>> try:
        ...     raise OSError("no /proc")
        ... except Exception as err:
        ...     faults.fault("memory hook `rss_pre_forward`", err, "its attributes are not saved")
        >>> sorted(faults.off)
        ['memory hook `rss_pre_forward`']
    """

    def __init__(self, warn: Warn) -> None:
        self._warn = warn
        self.off: set[str] = set()

    def fault(self, part: str, err: BaseException, consequence: str) -> None:
        """Switch ``part`` off after ``err``; the first time, warn with ``consequence``."""
        if part in self.off:
            return
        self.off.add(part)
        log.debug("%s failed", part, exc_info=err)
        self._warn(
            f"{part} raised {err!r} inside the training step; it is switched off for the rest "
            f"of the run ({consequence}), training continues"
        )


def no_warn(message: str, all_ranks: bool = False) -> None:
    """A stand-in warn function for collectors built outside a profiler (tests, benchmarks)."""
    log.warning("memprofiler: %s", message)
