"""Public import path of :class:`~memprofiler.lightning.cli.MemProfilerCLI` (``memprofiler.cli.MemProfilerCLI``)."""

from memprofiler.lightning.cli import MemProfilerCLI

__all__ = ["MemProfilerCLI"]
