"""The two error types memprofiler raises for a user's mistakes (and the one case of them a
command tells apart).

Everything else that goes wrong inside the profiler during training is a warning, never an
exception: a profiler fault must not kill a training run.
"""

from __future__ import annotations

import logging

#: memprofiler's logger: details of warned faults go to it at debug level.
log = logging.getLogger("memprofiler")


class MemProfilerError(Exception):
    """Base class for errors caused by the user's input (config, files, paths)."""


class ConfigError(MemProfilerError, ValueError):
    """A config value is wrong: the message names the dotted key, the bad value and the fix.

    Args:
        key: dotted config key, e.g. ``memprofiler.schedule.active``.
        message: what rule was broken and what is allowed.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.rule = message
        super().__init__(f"`{key}`: {message}" if key else message)

    def prefixed(self, prefix: str) -> ConfigError:
        """Return the same error with ``prefix`` prepended to its dotted key."""
        key = f"{prefix}.{self.key}" if self.key else prefix
        return ConfigError(key, self.rule)


class ArtifactError(MemProfilerError):
    """A file we were asked to read is missing, truncated, foreign or unsafe."""


class NoRunFilesError(ArtifactError):
    """A directory holds none of the files memprofiler writes: a command that can read
    something else there (``report``: profiler traces alone) tells this case by its type."""


class MemProfilerWarning(UserWarning):
    """A capability is missing or the profiler hit a fault; training continues."""
