"""``ExtendedPyTorchProfiler``: Lightning's PyTorch profiler, configurable from YAML.

What it adds to :class:`lightning.pytorch.profilers.PyTorchProfiler`:

* ``schedule_cfg``: a plain mapping for ``torch.profiler.schedule``, so the schedule can come
  from a YAML file (Lightning #20074), and ``repeat`` is honoured: Lightning stops after the
  first cycle (Lightning #14063).
* Only the stage's own step function (``training_step`` in ``fit``) advances the schedule,
  so profiler step ``k`` is exactly training call ``k + 1``, the count
  :class:`~memprofiler.MemProfiler` uses; ``schedule.follow_profiler`` relies on it.
* ``max_name_column_width`` and more ``sort_by_key`` values for the summary table.
* Activities are chosen automatically (CPU, plus CUDA when available); the deprecated
  ``use_cuda`` is dropped, so jsonargparse's default for it warns about nothing.
* Each rank writes its summary table to ``{stage}_rank_{rank}_summary.txt`` and one Chrome
  trace per cycle, by default ``{stage}_rank_{rank}.{cycle}.pt.trace.json``, which ``memprofiler
  report`` summarises (operator, module and memory views) and Perfetto shows as a timeline.
  With ``record_shapes``, ``profile_memory`` and ``with_stack`` on, memory by category goes to
  ``{stage}_rank_{rank}.{cycle}.memory_categories.json`` beside it. ``trace_files`` sets folder and name templates,
  gzip, how many cycles to keep and overwriting (:mod:`memprofiler.output.trace_files`). With a
  :class:`~memprofiler.MemProfilerCallback` in the same Trainer the files go to its run
  directory (remote ones included) and its memory counters are merged into the trace.
* ``timeline``: a span per Lightning hook of every step, the data-loader waits and host
  metrics sampled on an interval, merged into each trace and written for the whole run to
  ``step_timeline_rank_{rank}.json`` (:mod:`memprofiler.output.step_timeline`).
* Trace and summary are also written when training raises: Lightning only calls
  ``describe()`` on success, so the profiler adds a small callback that flushes it from
  ``on_exception``.
"""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PyTorchProfiler
from torch.profiler import ProfilerAction
from typing_extensions import override

from memprofiler import layout
from memprofiler.config._build import build_dataclass
from memprofiler.config.timeline import TimelineConfig
from memprofiler.config.trace_files import TraceFilesConfig
from memprofiler.core import run_setup
from memprofiler.core.run_files import DISK_FULL as _DISK_FULL
from memprofiler.core.warn import Warner
from memprofiler.errors import ConfigError
from memprofiler.lightning import _compat as compat
from memprofiler.lightning.memory_categories import CATEGORIES, write_category_timeline
from memprofiler.lightning.profiler_own_work import split_own_work
from memprofiler.lightning.profiler_schedule import STAGE_STEP, CyclicSchedule, build_schedule_config
from memprofiler.lightning.trace_output import (
    OutputDir,
    TraceOutput,
    action_track,
    resolve_output_dir,
    run_fields,
)
from memprofiler.output.mirror import RemoteMirror
from memprofiler.output.step_timeline import DATA, HOOKS, StepTimeline
from memprofiler.output.timeline import MemoryTimeline, TraceRows
from memprofiler.output.trace_files import TRACE, TraceCycle
from memprofiler.output.trace_splice import ChromeTrace
from memprofiler.output.writers import write_text

_DEPRECATED_KWARGS = ("use_cuda", "use_cpu", "use_device")


class _FlushOnException(Callback):
    """Resolves the profiler's output once every callback is set up (memprofiler's run directory
    is known then), and writes its trace and summary from ``on_exception`` (Lightning skips
    ``describe``)."""

    def __init__(self, profiler: ExtendedPyTorchProfiler) -> None:
        self._profiler = weakref.ref(profiler)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        profiler = self._profiler()
        if profiler is not None:
            profiler.prepare_output(trainer)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        profiler = self._profiler()
        if profiler is not None:
            profiler.flush_after_exception()


#: Prefix of the Lightning actions of :class:`_FlushOnException`'s hooks.
_OWN_CALLBACK = compat.callback_action_prefix(_FlushOnException.__qualname__)  # its state_key


class ExtendedPyTorchProfiler(PyTorchProfiler):
    """Lightning's ``PyTorchProfiler`` with a YAML schedule, ``repeat``, per-rank files and memory.

    Args:
        dirpath: output directory (a URL too); default: the run directory of the Trainer's
            ``MemProfilerCallback``, else ``trainer.log_dir``.
        filename: optional extra prefix of Lightning's own stream file (see ``PyTorchProfiler``).
        schedule_cfg: ``torch.profiler.schedule`` fields ``skip_first``, ``wait``, ``warmup``,
            ``active``, ``repeat`` (``0`` = forever). Missing keys default to
            ``{wait: 1, warmup: 1, active: 3, repeat: 1}``. Step ``k`` is the ``k+1``-th
            call of the stage's step function; step 0 cannot be profiled (the profiler
            decides its action before it starts), so ``skip_first + wait >= 1``.
        max_name_column_width: width of the summary's name column (long module names).
        sort_by_key: summary sort key; Lightning's keys plus the ``device_*`` and ``self_*``
            ones. Default ``device_time_total`` with CUDA, else ``cpu_time_total``.
        row_limit: rows of the summary table; ``-1`` for all.
        step_functions: which step functions advance the schedule; default the stage's own.
        export_to_chrome: write the Chrome traces.
        record_module_names: label operators with the module that ran them.
        group_by_input_shapes: group summary rows by input shapes (needs ``record_shapes``).
        table_kwargs: more ``EventList.table`` arguments.
        trace_files: :class:`~memprofiler.config.trace_files.TraceFilesConfig` fields: ``folder``
            and ``filename`` templates, ``use_gzip``, ``num_traces_to_keep``, ``overwrite``,
            ``run_name``. Templates are checked here: an unknown field raises.
        timeline: :class:`~memprofiler.config.timeline.TimelineConfig` fields: ``enabled``,
            ``hooks``, ``dataloader``, ``host_interval_s``, ``host_metrics``, ``max_events``.
        record_shapes: record operators' input shapes (the operator view's shapes column).
        profile_memory: record every allocation and release (the report's memory view).
        with_stack: record Python stacks. With ``record_shapes`` and ``profile_memory`` too,
            memory by category (parameters, optimizer state, activations, gradients...) is
            written beside each trace.
        with_flops: estimate FLOPs of matrix multiplications and convolutions.
        **profiler_kwargs: more ``torch.profiler.profile`` arguments (``activities``,
            ``with_modules``...), from Python only: a LightningCLI config sets the named
            arguments above. ``use_cuda``/``use_cpu`` are dropped: activities are chosen
            automatically.

    Raises:
        ConfigError: a bad ``schedule_cfg``, ``max_name_column_width``, ``step_functions``,
            ``trace_files`` or ``timeline``, or ``schedule`` given as well as ``schedule_cfg``;
            at set-up, a trace folder holding an earlier run's traces without ``overwrite``.
        MisconfigurationException: an unknown ``sort_by_key`` (Lightning's check).

    Example:
        .. code-block:: yaml

            trainer:
              profiler:
                class_path: memprofiler.ExtendedPyTorchProfiler
                init_args:
                  schedule_cfg: {wait: 1, warmup: 1, active: 2, repeat: 2}
                  profile_memory: true
                  record_shapes: true
                  with_stack: true
                  max_name_column_width: 100
                  trace_files: {use_gzip: true, num_traces_to_keep: 2}
                  timeline: {host_interval_s: 1.0, host_metrics: [cpu, rss]}
    """

    AVAILABLE_SORT_KEYS = PyTorchProfiler.AVAILABLE_SORT_KEYS | {
        "self_cpu_time_total",
        "device_time",
        "device_time_total",
        "self_device_time_total",
        "self_cuda_time_total",
        "device_memory_usage",
        "self_device_memory_usage",
    }

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        schedule_cfg: dict[str, int] | None = None,
        max_name_column_width: int = 100,
        sort_by_key: str | None = None,
        row_limit: int = 20,
        step_functions: list[str] | None = None,
        export_to_chrome: bool = True,
        record_module_names: bool = True,
        group_by_input_shapes: bool = False,
        table_kwargs: dict[str, Any] | None = None,
        trace_files: dict[str, Any] | None = None,
        timeline: dict[str, Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        **profiler_kwargs: Any,
    ) -> None:
        # Warn-once state of this profiler (every process warns: the old warnings were not rank-gated).
        self._warn = Warner(rank=0)
        if profiler_kwargs.get("emit_nvtx"):
            raise ConfigError(
                "emit_nvtx", "is not supported by ExtendedPyTorchProfiler; use Lightning's PyTorchProfiler"
            )
        if profiler_kwargs.pop("schedule", None) is not None:
            raise ConfigError("schedule", "give the schedule as a mapping in `schedule_cfg` instead")
        if profiler_kwargs.pop("on_trace_ready", None) is not None:
            raise ConfigError(
                "on_trace_ready", "is set by ExtendedPyTorchProfiler (it writes and merges the traces)"
            )
        if isinstance(max_name_column_width, bool) or not isinstance(max_name_column_width, int):
            raise ConfigError("max_name_column_width", f"got {max_name_column_width!r}; expected an integer")
        if max_name_column_width < 1:
            raise ConfigError("max_name_column_width", f"got {max_name_column_width}; must be >= 1")
        if step_functions is not None:
            allowed = sorted(set(STAGE_STEP.values()))
            if isinstance(step_functions, str) or not step_functions:
                raise ConfigError(
                    "step_functions",
                    f"got {step_functions!r}; give a non-empty list of {', '.join(allowed)}, or leave it unset",
                )
            for name in step_functions:
                if name not in allowed:
                    raise ConfigError("step_functions", f"got {name!r}; allowed: {', '.join(allowed)}")
        for name in _DEPRECATED_KWARGS:
            value = profiler_kwargs.pop(name, None)
            if value is not None:
                self._warn(
                    f"ExtendedPyTorchProfiler: `{name}` is deprecated and ignored; activities are automatic"
                )
        for name, value in (
            ("record_shapes", record_shapes),
            ("profile_memory", profile_memory),
            ("with_stack", with_stack),
            ("with_flops", with_flops),
        ):
            if not isinstance(value, bool):
                raise ConfigError(name, f"got {value!r}; expected true or false")
            profiler_kwargs[name] = value
        self.schedule_cfg = build_schedule_config(schedule_cfg)
        self.trace_files_cfg = _build(TraceFilesConfig, trace_files, "trace_files")
        self.timeline_cfg = _build(TimelineConfig, timeline, "timeline")
        sched = self.schedule_cfg
        profiler_kwargs["schedule"] = torch.profiler.schedule(
            skip_first=sched.skip_first, wait=sched.wait, warmup=sched.warmup, active=sched.active,
            repeat=sched.repeat,
        )  # fmt: skip
        profiler_kwargs["on_trace_ready"] = self._on_trace_ready
        table = dict(table_kwargs or {})
        table.setdefault("max_name_column_width", max_name_column_width)
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            group_by_input_shapes=group_by_input_shapes,
            export_to_chrome=export_to_chrome,
            row_limit=row_limit,
            sort_by_key=sort_by_key or _default_sort_key(profiler_kwargs),
            record_module_names=record_module_names,
            table_kwargs=table,
            **profiler_kwargs,
        )
        # Replace Lightning's wrapper (it stops after the first cycle) around the same schedule.
        self._schedule = CyclicSchedule(profiler_kwargs["schedule"])
        self._profiler_kwargs["schedule"] = self._schedule
        self._step_functions = None if step_functions is None else set(step_functions)
        self._timelines: list[MemoryTimeline] = []
        self._cycle = 0
        self._tables: list[tuple[int, str]] = []
        self._written: list[Path] = []
        #: The run's id, written into every trace: memprofiler's when its callback runs in the
        #: same Trainer, else agreed by the ranks when the first stage starts.
        self._run_id: str | None = None
        self._disk_full = False
        #: Run-level files (the step timeline) this profiler wrote: not an earlier run's.
        self._own_run_files: set[Path] = set()
        self._flusher: _FlushOnException | None = None
        self._trainer_ref: weakref.ReferenceType[pl.Trainer] | None = None
        self._closed = False
        self._explicit_dirpath = dirpath
        self._run_dir: OutputDir | None = None
        self._output: TraceOutput | None = None
        tl = self.timeline_cfg
        #: Hook spans, data-loader waits and host samples of every step (``None`` when off).
        self.step_timeline = StepTimeline(max_spans=tl.max_events) if tl.enabled else None
        #: Row kinds recorded (``hooks``, ``data``), as configured.
        self._recorded_tracks = {HOOKS: tl.enabled and tl.hooks, DATA: tl.enabled and tl.dataloader}
        #: Action name -> its timeline row, or "" when it is not recorded: decided once per name.
        self._tracks: dict[str, str] = {}

    # ----------------------------------------------------------------- wiring
    def add_memory_timeline(self, timeline: MemoryTimeline) -> None:
        """Merge ``timeline``'s events into every trace this profiler writes from now on."""
        if timeline not in self._timelines:
            self._timelines.append(timeline)

    def use_run_dir(self, save_dir: Path, mirror: RemoteMirror | None, run_id: str | None = None) -> None:
        """Write traces into a memprofiler run directory (uploaded by ``mirror`` when remote),
        unless ``dirpath`` was given."""
        self._run_dir = OutputDir(Path(save_dir), mirror)
        if run_id:
            self._run_id = run_id

    @property
    def trace_output(self) -> TraceOutput | None:
        """Where this stage's trace cycles go (set before training starts)."""
        return self._output

    def prepare_output(self, trainer: pl.Trainer) -> None:
        """Resolve the output directory and file names, refuse a used trace folder, start the
        host sampler. Called once every callback is set up, before training.

        Raises:
            ConfigError: the trace folder already holds traces and ``overwrite`` is false, the
                name templates do not tell the ranks of a multi-process run apart, or a filled-in
                name is no file name or leaves the output directory.
        """
        if self._output is not None and self._output.sampler is not None:
            self._output.sampler.stop()
        out = resolve_output_dir(self._explicit_dirpath, self._run_dir, self.dirpath, self._warn)
        self._output = None
        if out is None:
            return
        if self._run_id is None and self._run_dir is None:
            # alone (no memprofiler callback, whose run id `use_run_dir` passed): the ranks agree
            self._run_id = run_setup.share_new_id(self.rank)
        fields = run_fields(trainer, self.rank, self._stage_name, self.trace_files_cfg.run_name)
        if self.step_timeline is not None:
            self.step_timeline.rank = self.rank
        output = TraceOutput(
            self.trace_files_cfg, self.timeline_cfg, out, fields, self.step_timeline, self._warn
        )
        output.files.check_paths(kinds=[(CATEGORIES, ".json")])
        output.files.check_unique_per_rank()
        run_files = [
            output.files.folder / layout.PROFILER_SUMMARY_TXT.format(stage=self._stage_name, rank=self.rank)
        ]
        if self.step_timeline is not None:
            run_files.append(output.files.folder / layout.STEP_TIMELINE_JSON.format(rank=self.rank))
        output.files.check_overwrite(exclude={*self._written, *self._own_run_files}, run_files=run_files)
        self._output = output
        output.start()

    @property
    def rank(self) -> int:
        """Global rank (Lightning only passes the local rank, which repeats across nodes)."""
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if trainer is not None:
            return int(trainer.global_rank)
        return self.local_rank

    @property
    def _stage_name(self) -> str:
        # Lightning passes a `TrainerFn` (a str enum whose `str()` is `TrainerFn.FITTING`).
        stage = self._stage
        return str(getattr(stage, "value", stage)) if stage is not None else "run"

    @property
    def records_python_calls(self) -> bool:
        """Whether the Python tracer runs (``with_stack``): it records every Python call made
        while tracing, memprofiler's module trackers' too."""
        return bool(self._profiler_kwargs.get("with_stack"))

    @property
    def written_files(self) -> list[Path]:
        """Every trace and summary file written so far."""
        return list(self._written)

    @override
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage=stage, local_rank=local_rank, log_dir=log_dir)
        self._closed = False
        # An instance attribute: Lightning's `stop()` steps the profiler for these names only.
        self.STEP_FUNCTIONS = self._step_functions or {STAGE_STEP.get(self._stage_name, "training_step")}
        trainer = self._find_trainer()
        if trainer is None:
            return
        self._trainer_ref = weakref.ref(trainer)
        callbacks = _callbacks(trainer)
        if self._flusher is None or self._flusher not in callbacks:
            self._flusher = _FlushOnException(self)
            callbacks.append(self._flusher)

    def _find_trainer(self) -> pl.Trainer | None:
        try:
            module = self._lightning_module
            return module.trainer if module is not None else None
        except (RuntimeError, ReferenceError):
            return None

    # ----------------------------------------------------------------- output
    def _on_trace_ready(self, prof: torch.profiler.profile) -> None:
        # Called from inside `profiler.step()` in the training loop: a fault here must warn,
        # never raise into training.
        self._cycle += 1
        try:
            self._tables.append((self._cycle, self._table(prof)))
        except Exception as err:
            self._warn(
                f"ExtendedPyTorchProfiler could not tabulate cycle {self._cycle}: {err!r}", all_ranks=True
            )
        output = self._output
        if not self._export_to_chrome or output is None:
            return
        try:
            cycle = self._trace_cycle(prof, output)
            # Companion files of this cycle go through `output.files.write_bytes(kind, cycle, ...)`
            # (or `path_for` + `written`), so gzip and retention treat them as the trace.
            self._written.append(self._export_trace(prof, output, cycle))
            self._written += write_category_timeline(
                prof, lambda data: output.files.write_bytes(CATEGORIES, cycle, data), self._warn
            )
            self._dump_timeline(output)
        except Exception as err:
            if self._disk_is_full(err):
                return
            self._warn(
                f"ExtendedPyTorchProfiler could not write trace cycle {self._cycle}: {err!r}", all_ranks=True
            )

    def _disk_is_full(self, err: BaseException) -> bool:
        """Whether ``err`` is a full disk; if so, say it once for the run (each file the profiler
        writes is atomic, so what was written before the disk filled stays whole)."""
        if not (isinstance(err, OSError) and err.errno in _DISK_FULL):
            return False
        if not self._disk_full:
            self._disk_full = True
            self._warn(
                f"ExtendedPyTorchProfiler: the trace folder's disk is full ({err.strerror}) from "
                f"cycle {self._cycle} on; the files written before are kept whole, later ones "
                "(traces, step timeline, summary) are not written",
                all_ranks=True,
            )
        return True

    def _dump_timeline(self, output: TraceOutput) -> None:
        path = output.dump_timeline()
        if path is not None:
            self._own_run_files.add(path)

    def _table(self, prof: torch.profiler.profile) -> str:
        """The cycle's summary table, without memprofiler's own work (its host sampler's thread,
        its module tracker's dispatch: :mod:`~memprofiler.lightning.profiler_own_work`)."""
        events = prof.events()
        kept, own = split_own_work(events)
        mine = copy.copy(events)  # the same EventList settings (device, memory, flops), fewer events
        mine[:] = kept
        data = mine.key_averages(self._group_by_input_shapes)  # EventList names it group_by_input_shapes
        table = str(data.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs))
        note = own.note()
        return f"{table}{note}\n" if note else table

    def _trace_cycle(self, prof: torch.profiler.profile, output: TraceOutput) -> TraceCycle:
        """The cycle being written, with its ``{epoch}`` and ``{batch}``."""
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        epoch = int(trainer.current_epoch) if trainer is not None else 0
        # torch has counted the step that closed the cycle: the trace's last is step_num - 1.
        return output.files.cycle(self._cycle, epoch=epoch, batch=max(int(prof.step_num) - 1, 0))

    def _export_trace(self, prof: torch.profiler.profile, output: TraceOutput, cycle: TraceCycle) -> Path:
        files = output.files
        files.folder.mkdir(parents=True, exist_ok=True)
        tmp = files.folder / f".kineto.{os.getpid()}.{self._cycle}.tmp"  # dot: never uploaded
        try:
            prof.export_chrome_trace(str(tmp))
            data = self._merged(tmp.read_bytes(), cycle)
        finally:
            tmp.unlink(missing_ok=True)
        return files.write_bytes(TRACE, cycle, data)

    def _merged(self, kineto: bytes, cycle: TraceCycle) -> bytes:
        """Kineto's trace plus memory, step-timeline and cycle identity; on failure Kineto's alone.

        Our rows go in as text, Kineto's events stay the bytes Kineto wrote
        (:mod:`~memprofiler.output.trace_splice`).

        Raises:
            ValueError: Kineto's file is no JSON object (cut short on a full disk): not written.
        """
        try:
            trace = ChromeTrace.read(kineto)
        except ValueError as err:
            raise ValueError(f"Kineto's trace is no JSON ({err}); the cycle is not written") from None
        if not trace.is_object:
            raise ValueError("Kineto's trace is no JSON object; the cycle is not written")
        try:
            rows: list[TraceRows] = [*self._timelines]
            if self.step_timeline is not None:
                rows.append(self.step_timeline)
            # First in the file: a reader learns rank and run from the first bytes (analysis/runs/ids.py).
            ident = {"run_id": self._run_id, "rank": self.rank, "cycle": cycle.index, **_plain(cycle.fields)}
            # Kineto draws CPU events under this process's pid: our rows join them.
            return trace.with_rows(rows, os.getpid(), {"memprofiler": ident})
        except (ValueError, TypeError, KeyError) as err:
            self._warn(
                f"ExtendedPyTorchProfiler wrote trace cycle {self._cycle} without memory events: {err!r}"
            )
            return kineto

    def _write_summary(self, text: str) -> None:
        output = self._output
        if not text or output is None:
            return
        stage = self._stage_name
        # Beside the traces: a run given its own folder owns every file it writes.
        path = output.files.folder / layout.PROFILER_SUMMARY_TXT.format(stage=stage, rank=self.rank)
        self._written.append(write_text(path, text + os.linesep))

    @override
    def summary(self) -> str:
        """Stop profiling (writing the cycle in progress) and return every cycle's table.

        The text also goes to ``{stage}_rank_{rank}_summary.txt`` in the trace folder.
        """
        if not self._profiler_kwargs.get("enabled", True):
            return ""
        self._delete_profilers()
        text = ""
        if self._tables:
            stats = {f"cycle {cycle} of {self._stage_name}": table for cycle, table in self._tables}
            text = self._stats_to_str(stats)
        try:
            self._write_summary(text)
        except OSError as err:
            if not self._disk_is_full(err):
                self._warn(f"ExtendedPyTorchProfiler could not write its summary: {err}", all_ranks=True)
        self._tables = []
        self._finish_output()
        return text

    def _finish_output(self) -> None:
        """Stop the sampler, write the step timeline, push a remote store; never raises."""
        output = self._output
        if output is None:
            return
        try:
            finished = output.finish()
            if output.timeline_path is not None:
                self._own_run_files.add(output.timeline_path)
            if not finished:
                self._warn("ExtendedPyTorchProfiler: not every trace file reached the remote store")
        except Exception as err:
            if not self._disk_is_full(err):
                self._warn(
                    f"ExtendedPyTorchProfiler could not finish its trace files: {err!r}", all_ranks=True
                )

    @override
    def _cache_functions_events(self) -> None:
        prof = self.profiler
        if isinstance(prof, torch.profiler.profile) and prof.profiler is None:
            # The run ended before the schedule's first warmup step: nothing was recorded,
            # and asking torch for the events would raise after a successful fit.
            self.function_events = None
            self._warn("ExtendedPyTorchProfiler: the run ended before the schedule recorded any step")
            return
        try:
            super()._cache_functions_events()
        except Exception as err:  # torch's event parsing (private results) after a finished fit
            self.function_events = None
            self._warn(
                f"ExtendedPyTorchProfiler: torch could not list the last cycle's events ({err!r}); "
                "its traces are written, its summary table is left out",
                all_ranks=True,
            )

    def flush_after_exception(self) -> None:
        """Write the trace of the cycle in progress and the summary; never raises."""
        self._closed = True
        try:
            self.summary()
        except Exception as err:
            self._warn(f"ExtendedPyTorchProfiler could not flush after an exception: {err!r}", all_ranks=True)

    @override
    def start(self, action_name: str) -> None:
        # After an exception was flushed, Lightning still runs other callbacks' hooks inside
        # `profile()`: do not start a new profiler (and module hooks) that nothing would close.
        if self._closed:
            return
        timeline = self.step_timeline
        if timeline is not None:
            track = self._tracks.get(action_name)
            if track is None:
                track = self._tracks[action_name] = self._track_of(action_name)
            if track:
                timeline.begin(action_name, track)
        if self._idle():
            # Between windows nothing is recorded: skip the per-action `record_function` and
            # keep the per-module forward hooks off, so the profiler costs ~nothing there.
            self._remove_module_hooks()
            return
        super().start(action_name)

    def _track_of(self, action_name: str) -> str:
        """The timeline row ``action_name`` is recorded on, or "" when it is not recorded."""
        if action_name.startswith(_OWN_CALLBACK):  # the profiler's own helper: no hook of the user's
            return ""
        track = action_track(action_name)
        return track if self._recorded_tracks[track] else ""

    @override
    def stop(self, action_name: str) -> None:
        if self.step_timeline is not None:
            self.step_timeline.end(action_name)
        super().stop(action_name)

    def _idle(self) -> bool:
        prof = self.profiler
        return isinstance(prof, torch.profiler.profile) and prof.current_action is ProfilerAction.NONE

    def _remove_module_hooks(self) -> None:
        if self._register is not None:
            self._register.__exit__(None, None, None)
            self._register = None

    @override
    def teardown(self, stage: str | None) -> None:
        if not hasattr(self, "_closed"):  # an instance whose __init__ raised
            return
        super().teardown(stage=stage)
        if self._output is not None and self._output.sampler is not None:
            self._output.sampler.stop()
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if trainer is not None and self._flusher is not None and self._flusher in _callbacks(trainer):
            _callbacks(trainer).remove(self._flusher)
        self._flusher = None

    @override
    def __del__(self) -> None:
        # Lightning's `__del__` reads attributes an instance whose __init__ raised lacks.
        if hasattr(self, "_closed"):
            super().__del__()


def _build(cls: Any, given: Any, key: str) -> Any:
    if given is None:
        return cls()
    if isinstance(given, cls):
        return given
    if not isinstance(given, Mapping):
        raise ConfigError(key, f"got {given!r}; expected a mapping of {cls.__name__} fields")
    return build_dataclass(cls, given, key)


def _plain(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if isinstance(v, (str, int, float)) and k != "cycle"}


def _default_sort_key(profiler_kwargs: Mapping[str, Any]) -> str:
    activities = profiler_kwargs.get("activities")
    cuda = torch.profiler.ProfilerActivity.CUDA in activities if activities else torch.cuda.is_available()
    return "device_time_total" if cuda else "cpu_time_total"


def _callbacks(trainer: pl.Trainer) -> list[Callback]:
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's connector
    return callbacks
