"""Send each collected call's headline memory figures to the Trainer's loggers."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from memprofiler import metrics as vocab
from memprofiler.output.events import SnapshotEvent

#: Prefix of every logged name: ``memprofiler/{fn}/{metric}``.
PREFIX = "memprofiler"
#: Figures logged when present in the ``end`` snapshot (bytes).
HEADLINE_METRICS = (
    vocab.RSS_PEAK,
    vocab.SAVED_UNIQUE,
    vocab.CUDA_ALLOCATED_PEAK,
    vocab.CUDA_RESERVED_PEAK,
)


def headline_figures(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The headline figures of one ``end`` snapshot, tracker peaks (``fsdp.peak.*``,
    ``module_mem.peak.*``) included."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        wanted = name in HEADLINE_METRICS or name.startswith(vocab.TRACKER_PEAK_PREFIXES)
        if wanted and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class LoggerListener:
    """A :meth:`MemProfiler.add_listener` callback logging to every ``trainer.loggers`` entry.

    Figures are logged at the step Lightning logs the same batch's metrics at (for
    ``training_step`` call ``n`` that is ``n - 1``, the batches that stepped before it, under
    automatic and manual optimization alike). Loggers log on rank zero only, so multi-rank runs show rank
    zero's figures; every
    rank's figures are in its own ``rank_{rank}_memory_stats.yaml``.

    Args:
        trainer: the Trainer whose loggers receive the figures (held weakly).
    """

    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = weakref.ref(trainer)
        # The key and step of the last `end` logged: tracker peaks arriving at that call's
        # step end (after the optimizer stepped) are logged at the same step as the rest of it.
        self._last_end: tuple[str, int] | None = None

    def __call__(self, event: SnapshotEvent) -> None:
        phase, key, metrics = event.phase, event.key, event.metrics
        if phase not in ("end", "step_end"):
            return
        trainer = self._trainer()
        if trainer is None or not trainer.loggers:
            return
        if phase == "end":
            step = _logging_step(trainer)
            self._last_end = (key, step)
        else:
            last = self._last_end
            step = last[1] if last is not None and last[0] == key else _logging_step(trainer)
        figures = headline_figures(metrics)
        if not figures:
            return
        named = {f"{PREFIX}/{event.fn_name}/{name}": value for name, value in figures.items()}
        for logger in trainer.loggers:
            logger.log_metrics(named, step=step)


def _logging_step(trainer: pl.Trainer) -> int:
    """The step Lightning logs the current batch's metrics at: batches that stepped so far.

    Not ``global_step``: that counts optimizer steps, which under manual optimization have
    already happened when a call ends, and count twice with two optimizers.
    """
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    step = getattr(loop, "_batches_that_stepped", None)
    return int(step) if isinstance(step, int) else int(trainer.global_step)
