"""The framework-agnostic coordinator: schedule, calls, snapshots, files.

Nothing here imports Lightning. The Lightning callback, the mixin and the CLI are thin
adapters over :class:`MemProfiler`, which also serves Fabric and plain PyTorch loops.
Collector events go through :class:`~memprofiler.core.dispatch.CollectorSet`; collectors see
the profiler only as a :class:`~memprofiler.collectors.base.ProfilerView`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from memprofiler import layout
from memprofiler.collectors.base import CallContext
from memprofiler.collectors.cuda_backend import CudaBackend, default_backend
from memprofiler.collectors.registry import build_collectors
from memprofiler.config import MemProfilerConfig, urls
from memprofiler.core import run_setup, schedule
from memprofiler.core.decorator import ATTACH_ATTR, Attachment, memprofilable
from memprofiler.core.dispatch import CollectorSet
from memprofiler.core.method_wrap import Owner, WrappedMethods, wrap_methods
from memprofiler.core.run_files import RunFiles
from memprofiler.core.sigterm import SigtermDump
from memprofiler.core.warn import Warner
from memprofiler.output.events import Listener, Phase, SnapshotEvent
from memprofiler.output.mirror import RemoteMirror
from memprofiler.output.run_dir import RunManifest, crash_line
from memprofiler.output.timeline import MemoryTimeline
from memprofiler.user_line import warn_at_user


def _deprecated(what: str, instead: str) -> None:
    warn_at_user(f"{what} is deprecated; pass {instead} instead", DeprecationWarning)


def detect_rank() -> int:
    """Global rank from ``torch.distributed`` if initialised, else ``RANK``, else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return int(os.environ.get("RANK", "0"))


class _Run:
    """One collected call in flight."""

    __slots__ = ("ctx", "regs", "started")

    def __init__(self, ctx: CallContext, regs: list[Any], started: list[Any]) -> None:
        self.ctx = ctx
        self.regs = regs
        self.started = started


class MemProfiler:
    """Collects memory snapshots of ``@memprofilable`` calls selected by a schedule.

    Args:
        config: a :class:`MemProfilerConfig`, a mapping, YAML text or a YAML file path.
        save_dir: output directory; overrides ``config.save_dir``.
        rank: global rank used in keys and file names; detected when omitted.
        cuda: the CUDA seam; tests pass a fake.
        default_save_dir: where to write when neither ``save_dir`` nor ``config.save_dir`` is
            given (the Lightning callback passes ``<trainer.log_dir>/memprofiler``); else
            ``./memprofiler``.
        module: the profiled model, when it exists already; else give it to :meth:`bind`.
        step_fn: returns the training step, for crash records (the Lightning callback passes
            ``lambda: trainer.global_step``).
        summary_collective: every rank is known to reach :meth:`teardown` together (the
            Lightning callback): the cross-rank summary then meets in collectives. Otherwise
            (plain loops, Fabric, a profiler on some ranks only) ranks post to the process
            group's store and rank 0 waits a bounded time: nothing can hang.
        listeners: called with every :class:`~memprofiler.output.events.SnapshotEvent` (see
            :meth:`add_listener`).

    Everything the profiler holds comes in here, except the model when it is prepared later
    (wrapped, sharded, its optimizers made): that comes by :meth:`bind`.

    Raises:
        ConfigError: the config is invalid (names the dotted key).

    Example:
        >>> prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp)  # doctest: +SKIP
        >>> with prof:  # set up, and dump at exit even when the loop raises
        ...     for batch in loader:
        ...         with prof.profile("training_step", module=model):
        ...             loss = model(batch).sum()
        ...         loss.backward()
        ...         prof.step_end()
    """

    memprofilable = staticmethod(memprofilable)

    def __init__(
        self,
        config: MemProfilerConfig | Mapping[str, Any] | str | Path | None = None,
        *,
        save_dir: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        cuda: CudaBackend | None = None,
        default_save_dir: str | os.PathLike[str] | None = None,
        module: nn.Module | None = None,
        step_fn: Callable[[], int] | None = None,
        summary_collective: bool = False,
        listeners: Sequence[Listener] = (),
    ) -> None:
        self.config = MemProfilerConfig.from_any(config)
        self._rank = detect_rank() if rank is None else rank
        if save_dir:  # the config checked its own save_dir, the callback Lightning's default_root_dir
            urls.check_dir(save_dir, "save_dir")
        chosen = save_dir or self.config.save_dir or default_save_dir or layout.DEFAULT_SUBDIR
        self._module = module
        self._attached: nn.Module | None = None  # the first module attached, if none is given
        self.optimizers: list[torch.optim.Optimizer] = []
        self.warn = Warner(self._rank)
        self._files = RunFiles(self.config, self._rank, chosen, self.warn, summary_collective)
        self._cuda = cuda or default_backend()
        self._calls: dict[str, int] = {}
        self._finished: set[str] = set()
        self._collectors = CollectorSet([], self.warn)
        self._collected_funcs: frozenset[str] = frozenset()
        self._active: _Run | None = None
        self._is_setup = False
        self._crashed = False
        self._collected_calls: dict[str, int] = {}
        self._wrapped = WrappedMethods()
        # True from the end of a collected call until `step_end()`: step-long collectors
        # (module-wise trackers) are still recording backward and the optimizer step.
        self._step_open = False
        self._dump_after_step = False
        self._listeners: list[Listener] = list(listeners)
        self._step_fn = step_fn
        self._sigterm = SigtermDump(lambda: self.record_crash(SystemExit("SIGTERM")))

    # ----------------------------------------------------------------- the view collectors get
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def save_dir(self) -> Path:
        """Where this run writes: resolved once, at :meth:`setup` (for a remote ``save_dir``, the
        local staging directory whose files each flush uploads to :attr:`run_url`)."""
        return self._files.save_dir

    @property
    def mirror(self) -> RemoteMirror | None:
        """The uploader of a remote ``save_dir`` (set at :meth:`setup`); ``None`` when local.

        Files other writers put under :attr:`save_dir` go up with the run's own."""
        return self._files.mirror

    @property
    def run_url(self) -> str:
        """Where the run's files end up: the remote run directory's URL, or :attr:`save_dir`."""
        return self._files.run_url if self._files.run_url is not None else str(self._files.save_dir)

    @property
    def save_url(self) -> str | None:
        """A remote ``save_dir`` (``s3://...``, any fsspec URL) as asked for; ``None`` when local."""
        return self._files.save_url

    @property
    def run_id(self) -> str | None:
        """The run's id, in every file it writes (set at :meth:`setup`; ``None`` on a rank that
        could not learn rank 0's)."""
        stats = self._files.stats
        return stats.run_id if stats is not None else None

    @property
    def timeline(self) -> MemoryTimeline | None:
        """Chrome-trace view of the snapshots (``dump_memory_trace``); built at set-up."""
        return self._files.timeline

    @property
    def evicted(self) -> int:
        """Snapshots dropped from memory after they reached the stats file."""
        return self._files.evicted

    @property
    def snapshots(self) -> dict[str, dict[str, Any]]:
        """The snapshots recorded and not yet dropped from memory, by key (see
        ``max_snapshots_in_memory``)."""
        return self._files.snapshots

    @property
    def module(self) -> nn.Module | None:
        """The profiled model: given to the constructor or :meth:`bind`, else the first module
        :meth:`attach` saw."""
        return self._module if self._module is not None else self._attached

    @property
    def summary_collective(self) -> bool:
        """Whether the cross-rank summary meets in collectives (see the constructor)."""
        return self._files.summary_collective

    @summary_collective.setter
    def summary_collective(self, value: bool) -> None:
        _deprecated("setting `MemProfiler.summary_collective`", "`MemProfiler(summary_collective=...)`")
        self._files.summary_collective = value

    @property
    def step_fn(self) -> Callable[[], int] | None:
        """Returns the training step for crash records (see the constructor)."""
        return self._step_fn

    @step_fn.setter
    def step_fn(self, fn: Callable[[], int] | None) -> None:
        _deprecated("setting `MemProfiler.step_fn`", "`MemProfiler(step_fn=...)`")
        self._step_fn = fn

    def current_step(self) -> int | None:
        """The training step from ``step_fn``, or ``None`` when unknown."""
        if self._step_fn is None:
            return None
        try:
            return int(self._step_fn())
        except Exception:
            return None

    def call_counts(self) -> dict[str, int]:
        """Calls counted so far, per ``@memprofilable`` function."""
        return dict(self._calls)

    def call_count(self, fn_name: str) -> int:
        """How many calls of ``fn_name`` have been counted."""
        return self._calls.get(fn_name, 0)

    # ----------------------------------------------------------------- life cycle
    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def setup(self, module: nn.Module | None = None) -> MemProfiler:
        """Claim the run directory and build the collectors. Idempotent.

        Args:
            module: shorthand for ``bind(module)`` first (the optimizers already bound stay).

        Raises:
            ArtifactError: ``save_dir`` cannot be created or written.
        """
        if module is not None:
            self._module = module
        if self._is_setup or not self.enabled:
            return self
        self._files.claim()
        self._collectors = CollectorSet(build_collectors(self.config, self._cuda, self.warn), self.warn)
        self._collected_funcs = self.config.collect_funcs.all_funcs()
        if self._files.timeline is not None:
            self._listeners.insert(0, self._files.timeline.on_snapshot)  # the trace sees events first
        self._is_setup = True
        self._collectors.bind(self)
        return self

    def bind(self, module: nn.Module | None = None, optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
        """Give the collectors the model as prepared for training, and its optimizers.

        Call it once the model is wrapped or sharded (after ``fully_shard``) and the optimizers
        exist; the Lightning callback does so at fit start. Collectors that need neither ignore it.

        Args:
            module: the profiled module; defaults to the one given to :meth:`setup`.
            optimizers: every optimizer that steps the module's parameters.

        Raises:
            ConfigError: an option does not fit the model (e.g. the FSDP root module is missing
                or not ``fully_shard``-ed); the message names the key and the fix.
        """
        if module is not None:
            self._module = module
        self.optimizers = list(optimizers)
        if self._is_setup:
            self._collectors.bind_model(self.module, self.optimizers)

    def step_end(self) -> None:
        """Mark the end of a training step: after backward and the optimizer step.

        Collectors whose window spans the whole step (``track_fsdp_mem``, ``track_module_mem``)
        stop here and merge their metrics into the ``.end`` snapshot of the call they started
        in. The Lightning callback calls it at every ``on_*_batch_end``; a plain loop calls it
        after ``optimizer.step()``. If nobody does, the next profiled call or :meth:`dump`
        closes the window. Costs one attribute check when no window is open.
        """
        if not self._step_open:
            return
        self._step_open = False
        now = time.time_ns()
        for (fn, call), metrics in self._collectors.step_end().items():
            key = layout.snapshot_key(self._rank, fn, call, "end")
            self._files.merge_late(key, metrics)
            # Listeners see the late metrics as phase "step_end" of the same call.
            self._notify(SnapshotEvent(key, self._rank, fn, call, "step_end", now, metrics))
        if self._dump_after_step:
            self._dump_after_step = False
            self.dump()

    def attach(self, obj: Any) -> None:
        """Let ``@memprofilable`` methods of ``obj`` report to this profiler.

        ``attach`` is all a method needs; call :meth:`bind` as well once the model is wrapped
        or sharded and its optimizers exist, for the collectors that track the model itself
        (``track_fsdp_mem``, ``track_module_mem``; they fall back to the attached module).
        """
        if self.enabled:
            object.__setattr__(obj, ATTACH_ATTR, Attachment(self))
            if isinstance(obj, nn.Module) and self._attached is None:
                self._attached = obj

    def wrap_methods(self, owners: Sequence[Owner]) -> list[str]:
        """Collect the ``collect_funcs`` methods of ``owners`` with no ``@memprofilable`` in their code.

        Each configured name is wrapped, at its class, on the first owner that has it as a
        method (see :mod:`memprofiler.core.method_wrap`); the owner is attached. A decorated
        method is left as it is. A name no owner has is one warning now, naming the classes
        searched and the close matches, and the run's note at the end. :meth:`teardown` (also
        after an exception) undoes it; so does :meth:`unwrap_methods`.

        Args:
            owners: the objects to search, in order (the Lightning callback gives the
                LightningModule, the DataModule and the strategy).

        Returns:
            ``Class.name`` of every method wrapped.

        Example:
            >>> prof.attach(model)  # doctest: +SKIP
            >>> prof.wrap_methods([Owner("the model", model)])  # model.train_step is collected
        """
        if not (self.enabled and self._is_setup):
            return []
        self.unwrap_methods()
        self._wrapped = wrap_methods(self.config.collect_funcs.keyed_funcs(), owners)
        for obj in self._wrapped.owners:
            self.attach(obj)
        for line in self._wrapped.unresolved.values():
            self.warn(line)
        return self._wrapped.wrapped

    def unwrap_methods(self) -> None:
        """Undo :meth:`wrap_methods`: each class as it was, each owner detached. Idempotent."""
        self._wrapped.restore()
        for obj in self._wrapped.owners:
            self.detach(obj)
        self._wrapped.owners.clear()

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(event)`` with a :class:`~memprofiler.output.events.SnapshotEvent` after
        every snapshot is recorded.

        ``event.phase`` is ``start`` or ``end``, or ``step_end`` for metrics that step-long
        collectors (module-wise trackers) add to the ``end`` snapshot after backward and the
        optimizer step; ``event.metrics`` then holds only those. A listener that raises is
        warned about and removed; training continues.
        """
        self._listeners.append(fn)

    @staticmethod
    def detach(obj: Any) -> None:
        obj.__dict__.pop(ATTACH_ATTR, None)

    def teardown(self) -> list[Path]:
        """Write the files and release every hook and thread the collectors hold."""
        self.unwrap_methods()
        written = self.dump(final=True)
        if self._is_setup and not self._crashed:
            written.extend(self._files.write_summary(after_exception=False))
        self._collectors.close()
        return written

    def __enter__(self) -> MemProfiler:
        """Set up; until exit, SIGTERM (where it has its default action) writes the files first."""
        self.setup()
        self._sigterm.install()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._sigterm.remove()
        if exc is not None:
            self.record_crash(exc)
        self.teardown()

    def record_crash(self, exc: BaseException) -> list[Path]:
        """Training ends with ``exc``: let collectors write crash records, then write every file.

        Never raises. Lightning's ``on_exception`` (SIGTERM included) and leaving the context
        manager by an exception call it; call it yourself where a loop catches the exception.

        Example:
            >>> try:  # doctest: +SKIP
            ...     train(prof)
            ... except Exception as err:
            ...     prof.record_crash(err)
            ...     raise
        """
        if not self._is_setup:
            return []
        if self._files.manifest is not None:
            self._files.manifest.status = "crashed"
            self._files.manifest.error = crash_line(exc)
        self._crashed = True
        written = self._collectors.crash(exc)
        written += self.dump(final=True)
        return written + self._files.write_summary(after_exception=True)

    # ----------------------------------------------------------------- collection
    @contextmanager
    def profile(self, fn_name: str, module: nn.Module | None = None) -> Iterator[None]:
        """Count one call of ``fn_name``; collect it if the schedule selects it.

        Use this around a step in a plain loop or Fabric. ``module`` is the model whose
        parameters are excluded from saved-tensor bytes and whose submodules are tracked.
        """
        run = self.begin(fn_name, module)
        ok = False
        try:
            yield
            ok = True
        finally:
            if run is not None:
                self.finish(run, ok)

    def begin(self, fn_name: str, module: nn.Module | None = None) -> _Run | None:
        """Count a call and start collecting it if scheduled; pair with :meth:`finish`."""
        if self._step_open:
            self.step_end()
        if not self._is_setup:
            return None
        call = self._calls.get(fn_name, 0) + 1
        self._calls[fn_name] = call
        if fn_name in self._finished:
            return None
        if fn_name not in self._collected_funcs:
            self._finished.add(fn_name)
            return None
        try:
            return self._begin(fn_name, call, module)
        except Exception as err:  # a profiler fault never kills training
            self.warn(f"internal error while starting `{fn_name}` call {call}: {err!r}; skipping it")
            return None

    def _begin(self, fn_name: str, call: int, module: nn.Module | None) -> _Run | None:
        sched = self.config.schedule
        act = schedule.action(sched, call)
        if schedule.is_finished(sched, call) and not act.collects:
            self._finished.add(fn_name)
        if act is schedule.Action.NONE:
            return None
        regs = self._collectors.for_function(fn_name)
        ctx = CallContext(
            fn_name=fn_name,
            call=call,
            rank=self._rank,
            module=module if module is not None else self.module,
            closes_window=schedule.closes_window(sched, call, act),
        )
        if act is schedule.Action.WARMUP:
            self._collectors.warmup(regs, ctx)
            return None
        if self._active is not None:
            self.warn(
                f"`{fn_name}` was called inside collected `{self._active.ctx.fn_name}`; "
                "nested calls are counted but not collected"
            )
            return None
        started, metrics = self._collectors.start(regs, ctx)
        self._record(ctx, "start", metrics, time.time_ns())
        run = _Run(ctx, regs, started)
        self._active = run
        return run

    def finish(self, run: _Run, ok: bool) -> None:
        """End a collected call started by :meth:`begin`.

        A call that raised still gets its ``end`` snapshot, marked ``failed: true``: its peak
        is often the figure that explains the failure.
        """
        t_end = time.time_ns()  # before any collector's end work, which is not the call's time
        self._active = None
        ctx = run.ctx
        metrics = self._collectors.end(run.started, ctx, ok)
        if not ok:
            metrics["failed"] = True
        self._record(ctx, "end", metrics, t_end)
        self._collected_calls[ctx.fn_name] = self._collected_calls.get(ctx.fn_name, 0) + 1
        if ok and any(reg.collector.spans_step for reg in run.started):
            self._step_open = True
        if schedule.is_finished(self.config.schedule, ctx.call):
            self._finished.add(ctx.fn_name)
        if self._files.call_collected() or ctx.closes_window:
            # Write what was collected now, so a process killed later (the host OOM killer
            # sends SIGKILL) still leaves it on disk: at every window close, and every
            # `flush_every_calls` collected calls or `flush_interval_s` seconds whatever the
            # schedule. Each flush appends only what is new.
            if self._step_open:
                self._dump_after_step = True
            else:
                self.dump()

    def _record(self, ctx: CallContext, phase: Phase, metrics: dict[str, Any], t_ns: int) -> None:
        key = layout.snapshot_key(self._rank, ctx.fn_name, ctx.call, phase)
        self._files.record(key, metrics)
        self._notify(SnapshotEvent(key, self._rank, ctx.fn_name, ctx.call, phase, t_ns, metrics))

    def _notify(self, event: SnapshotEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception as err:
                self.warn(f"snapshot listener {listener!r} failed ({err!r}); it is removed")
                self._listeners.remove(listener)

    # ----------------------------------------------------------------- output
    def dump(self, final: bool = False) -> list[Path]:
        """Write every enabled output file; safe to call repeatedly.

        The stats YAML and the memory trace grow by what is new since the last dump. Never
        raises: a write failure is a warning, and whatever else can be written is.

        Args:
            final: the run is over (teardown, crash): also fsync, and close the manifest.
        """
        if not self._is_setup:
            return []
        self.step_end()
        written = self._files.write(final, self._notes)
        written.extend(self._collectors.dump())
        self._files.after_write(final)
        return written

    def _notes(self, manifest: RunManifest) -> list[str]:
        """What the run failed to collect, one line per function, warned and kept in the manifest."""
        notes = run_setup.collection_notes(
            self.config, self._calls, self._collected_calls, self._collected_funcs, self._wrapped.unresolved
        )
        for note in notes:
            self.warn(note)
        return notes
