"""Where the extended profiler's trace cycles go, and the step timeline it feeds from Lightning.

:class:`TraceOutput` is resolved once the Trainer's callbacks are set up, before training:
the output directory (a :class:`~memprofiler.MemProfilerCallback`'s run directory, remote
ones included, else ``dirpath`` / the Trainer's log dir, which may itself be a URL), the
template fields of this rank, the :class:`~memprofiler.output.trace_files.TraceFiles` that
names and retires the files, and the host sampler of the step timeline.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from memprofiler.config.timeline import TimelineConfig
from memprofiler.config.trace_files import TraceFilesConfig
from memprofiler.core.host_sampler import HostSampler
from memprofiler.lightning import _compat as compat
from memprofiler.output.mirror import RemoteMirror
from memprofiler.output.remote import RemoteDir, is_url, local_path
from memprofiler.output.step_timeline import DATA, HOOKS, StepTimeline
from memprofiler.output.trace_files import TraceFiles


def action_track(action_name: str) -> str:
    """The timeline row of a Lightning profiler action: a loop's action around
    ``next(data_fetcher)`` (``[_TrainingEpochLoop].train_dataloader_next``,
    ``[_EvaluationLoop].val_next``, ...) times exactly the wait for one batch."""
    return DATA if compat.is_dataloader_wait(action_name) else HOOKS


def run_name(trainer: pl.Trainer, given: str | None) -> str:
    """``{run_name}``: as given, else the logger's ``{name}_{version}``, else ``run``."""
    if given:
        return given
    logger = trainer.logger
    if logger is None:
        return "run"
    version = logger.version
    version_text = version if isinstance(version, str) else f"version_{version}"
    return f"{logger.name}_{version_text}" if logger.name else str(version_text)


def run_fields(trainer: pl.Trainer, rank: int, stage: str, given_run_name: str | None) -> dict[str, Any]:
    """The folder template fields of this rank."""
    return {
        "run_name": run_name(trainer, given_run_name),
        "rank": rank,
        "local_rank": int(trainer.local_rank),
        "node_rank": int(trainer.node_rank),
        "world_size": int(trainer.world_size),
        "stage": stage,
    }


@dataclass
class OutputDir:
    """A local directory to write into, and the mirror that uploads it (remote ``save_dir``)."""

    root: Path
    mirror: RemoteMirror | None = None


def resolve_output_dir(
    explicit: str | os.PathLike[str] | None,
    run_dir: OutputDir | None,
    fallback: str | os.PathLike[str] | None,
    warn: Any,
) -> OutputDir | None:
    """An explicit ``dirpath`` wins, then memprofiler's run directory, then the Trainer's log
    dir; a URL gets a local staging directory mirrored to it."""
    if explicit is None and run_dir is not None:
        return run_dir
    chosen = explicit if explicit is not None else fallback
    if chosen is None:
        return None
    if is_url(chosen):
        staging = Path(tempfile.mkdtemp(prefix="memprofiler-traces-"))
        remote = RemoteDir.from_url(os.fspath(chosen), key="dirpath")
        mirror = RemoteMirror(staging, remote, lambda message: warn(message, all_ranks=True))
        atexit.register(mirror.cleanup)
        return OutputDir(staging, mirror)
    return OutputDir(local_path(chosen))


class TraceOutput:
    """The files and the step timeline of one profiler in one stage of one Trainer.

    Args:
        files_cfg: trace file naming, gzip, retention.
        timeline_cfg: the step timeline and its host sampler.
        out: where to write.
        fields: the rank's template fields (:func:`run_fields`).
        timeline: the profiler's step timeline (it outlives stages), or ``None`` when off.
        warn: the profiler's warn-once.
    """

    def __init__(
        self,
        files_cfg: TraceFilesConfig,
        timeline_cfg: TimelineConfig,
        out: OutputDir,
        fields: dict[str, Any],
        timeline: StepTimeline | None,
        warn: Any,
    ) -> None:
        self.files = TraceFiles(files_cfg, out.root, fields, mirror=out.mirror, warn=warn)
        self._warn = warn
        self.timeline = timeline
        self.sampler: HostSampler | None = None
        #: The step timeline file :meth:`finish` wrote.
        self.timeline_path: Path | None = None
        if timeline is not None and timeline_cfg.samples_host:
            self.sampler = HostSampler(
                timeline_cfg.host_interval_s,
                timeline_cfg.host_metrics,
                max_samples=timeline_cfg.max_events,
                on_error=lambda message: warn(message, all_ranks=True),
            )
            timeline.host = self.sampler

    def start(self) -> None:
        """Start the host sampler; a fault warns and turns it off, training goes on."""
        if self.sampler is not None:
            try:
                self.sampler.start()
            except Exception as err:
                self._warn(
                    f"host sampler could not start ({type(err).__name__}: {err}); no host rows",
                    all_ranks=True,
                )
                self.sampler = None
                if self.timeline is not None:
                    self.timeline.host = None

    def dump_timeline(self) -> Path | None:
        """Rewrite the rank's whole-run step timeline beside the traces."""
        if self.timeline is None:
            return None
        folder = self.files.folder
        lock = self.files.mirror.lock if self.files.mirror is not None else None
        if lock is None:
            return self.timeline.dump(folder)
        with lock:
            return self.timeline.dump(folder)

    def finish(self) -> bool:
        """Stop the sampler, write the step timeline, wait for a remote store.

        Raises:
            OSError: the step timeline could not be written (the store is waited for first).
        """
        if self.sampler is not None:
            self.sampler.stop()
        try:
            self.timeline_path = self.dump_timeline()
        except OSError:
            self.files.finish()  # the traces still go to a remote store
            raise
        return self.files.finish()
