"""Deprecated import path of :class:`~memprofiler.lightning.cli.MemProfilerCLI`.

The ``memprofiler`` command is :mod:`memprofiler.__main__`; the LightningCLI lives with the other
Lightning adapters. Import ``MemProfilerCLI`` from ``memprofiler`` or ``memprofiler.lightning.cli``.
"""

import warnings

from memprofiler.lightning.cli import MemProfilerCLI

warnings.warn(
    "`memprofiler.cli` is deprecated; import `MemProfilerCLI` from `memprofiler.lightning.cli` "
    "(or `memprofiler`)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["MemProfilerCLI"]
