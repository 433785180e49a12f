"""The framework-agnostic core: schedule, collectors, snapshots, files.

Nothing here imports Lightning. The Lightning callback, the mixin and the CLI are thin
adapters over :class:`MemProfiler`, which also serves Fabric and plain PyTorch loops.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from memprofiler import layout
from memprofiler.collectors.base import CallContext
from memprofiler.collectors.cuda_backend import CudaBackend, default_backend
from memprofiler.collectors.registry import Registered, build_collectors
from memprofiler.config import MemProfilerConfig
from memprofiler.core import schedule
from memprofiler.core.decorator import ATTACH_ATTR, Attachment, memprofilable
from memprofiler.core.sigterm import SigtermDump
from memprofiler.core.warn import log, warn_once
from memprofiler.errors import ArtifactError, MemProfilerError
from memprofiler.output.snapshot_cache import SnapshotCache
from memprofiler.output.timeline import MemoryTimeline
from memprofiler.output.writers import write_pickle, write_text


def detect_rank() -> int:
    """Global rank from ``torch.distributed`` if initialised, else ``RANK``, else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return int(os.environ.get("RANK", "0"))


class _Run:
    """One collected call in flight."""

    __slots__ = ("collectors", "ctx", "started")

    def __init__(self, ctx: CallContext, collectors: list[Registered]) -> None:
        self.ctx = ctx
        self.collectors = collectors
        self.started: list[Registered] = []


class MemProfiler:
    """Collects memory snapshots of ``@memprofilable`` calls selected by a schedule.

    Args:
        config: a :class:`MemProfilerConfig`, a mapping, YAML text or a YAML file path.
        save_dir: output directory; overrides ``config.save_dir``.
        rank: global rank used in keys and file names; detected when omitted.
        cuda: the CUDA seam; tests pass a fake.

    Raises:
        ConfigError: the config is invalid (names the dotted key).

    Example:
        >>> prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp)  # doctest: +SKIP
        >>> with prof:  # set up, and dump at exit even when the loop raises
        ...     for batch in loader:
        ...         with prof.profile("train_step", module=model):
        ...             loss = model(batch).sum()
        ...         loss.backward()
    """

    memprofilable = staticmethod(memprofilable)

    def __init__(
        self,
        config: MemProfilerConfig | Mapping[str, Any] | str | Path | None = None,
        *,
        save_dir: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        cuda: CudaBackend | None = None,
    ) -> None:
        self.config = MemProfilerConfig.from_any(config)
        self.rank = detect_rank() if rank is None else rank
        chosen = save_dir or self.config.save_dir or layout.DEFAULT_SUBDIR
        self.save_dir = Path(chosen).expanduser()
        self.snapshots: dict[str, dict[str, Any]] = {}
        # Serialised snapshots, per key: a window-close rewrite converts only what changed.
        self._snapshot_cache = SnapshotCache()
        self.module: nn.Module | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self._cuda = cuda or default_backend()
        self._calls: dict[str, int] = {}
        self._finished: set[str] = set()
        self._collectors: list[Registered] = []
        self._collected_funcs: frozenset[str] = frozenset()
        self._active: _Run | None = None
        self._is_setup = False
        # True from the end of a collected call until `step_end()`: step-long collectors
        # (module-wise trackers) are still recording backward and the optimizer step.
        self._step_open = False
        self._dump_after_step = False
        self._listeners: list[Callable[[str, dict[str, Any], CallContext], None]] = []
        #: Returns the training step for crash records (the Lightning callback sets it).
        self.step_fn: Callable[[], int] | None = None
        #: Chrome-trace view of the snapshots (``dump_memory_trace``); built at setup.
        self.timeline: MemoryTimeline | None = None
        self._sigterm = SigtermDump(lambda: self.record_crash(SystemExit("SIGTERM")))

    # ----------------------------------------------------------------- life cycle
    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def setup(self, module: nn.Module | None = None) -> MemProfiler:
        """Check the output directory and build the collectors. Idempotent.

        Raises:
            ArtifactError: ``save_dir`` cannot be created or written.
        """
        if module is not None:
            self.module = module
        if self._is_setup or not self.enabled:
            return self
        check_writable(self.save_dir)
        self._collectors = build_collectors(self.config, self._cuda, self._warn)
        self._collected_funcs = self.config.collect_funcs.all_funcs()
        if self.config.dump_memory_trace:
            self.timeline = MemoryTimeline(self.rank)
            self.add_listener(self.timeline.on_snapshot)
        self._is_setup = True
        for reg in list(self._collectors):
            # Collectors that write their own files or read the snapshots get the profiler.
            bind = getattr(reg.collector, "bind", None)
            if bind is not None:
                self._guard(reg, "bind", lambda b=bind: b(self))
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
            self.module = module
        self.optimizers = list(optimizers)
        if not self._is_setup:
            return
        for reg in list(self._collectors):
            bind_model = getattr(reg.collector, "bind_model", None)
            if bind_model is not None:
                self._guard(
                    reg,
                    "bind_model",
                    lambda b=bind_model: b(self.module, self.optimizers),
                    reraise=(MemProfilerError,),
                )

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
        for reg in list(self._collectors):
            end_step = getattr(reg.collector, "step_end", None)
            if end_step is None:
                continue
            out = self._guard(reg, "step_end", end_step)
            for key, metrics in (out or {}).items():
                self._snapshot_cache.touch(key)  # first: a SIGTERM dump may run mid-update
                self.snapshots.setdefault(key, {}).update(metrics)
                # Listeners see the late metrics as phase "step_end" of the same call.
                rank, fn, call, _ = layout.parse_snapshot_key(key)
                ctx = CallContext(fn_name=fn, call=call, rank=rank, module=self.module)
                ctx.scratch.update(phase="step_end", t_ns=time.time_ns())
                self._notify(key, metrics, ctx)
        if self._dump_after_step:
            self._dump_after_step = False
            self.dump()

    def attach(self, obj: Any) -> None:
        """Let ``@memprofilable`` methods of ``obj`` report to this profiler."""
        if self.enabled:
            object.__setattr__(obj, ATTACH_ATTR, Attachment(self))
            if isinstance(obj, nn.Module) and self.module is None:
                self.module = obj

    def add_listener(self, fn: Callable[[str, dict[str, Any], CallContext], None]) -> None:
        """Call ``fn(key, metrics, ctx)`` after every snapshot is recorded.

        ``ctx.scratch["phase"]`` is ``start`` or ``end``, or ``step_end`` for metrics that
        step-long collectors (module-wise trackers) add to the ``end`` snapshot after backward
        and the optimizer step; ``metrics`` then holds only those.

        ``ctx.scratch["t_ns"]`` holds the ``time.time_ns()`` at which the snapshot was taken.
        A listener that raises is warned about and removed; training continues.
        """
        self._listeners.append(fn)

    def _record(self, phase: str, metrics: dict[str, Any], ctx: CallContext, t_ns: int | None = None) -> None:
        key = layout.snapshot_key(self.rank, ctx.fn_name, ctx.call, phase)
        self.snapshots[key] = metrics
        self._snapshot_cache.touch(key)
        ctx.scratch["t_ns"] = time.time_ns() if t_ns is None else t_ns
        ctx.scratch["phase"] = phase
        self._notify(key, metrics, ctx)

    def _notify(self, key: str, metrics: dict[str, Any], ctx: CallContext) -> None:
        for listener in list(self._listeners):
            try:
                listener(key, metrics, ctx)
            except Exception as err:
                self._warn(f"snapshot listener {listener!r} failed ({err!r}); it is removed")
                self._listeners.remove(listener)

    @staticmethod
    def detach(obj: Any) -> None:
        obj.__dict__.pop(ATTACH_ATTR, None)

    def teardown(self) -> list[Path]:
        """Write the files and release every hook and thread the collectors hold."""
        written = self.dump()
        for reg in self._collectors:
            self._guard(reg, "close", lambda r=reg: r.collector.close())
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
        written: list[Path] = []
        if not self._is_setup:
            return written
        for reg in list(self._collectors):
            crash = getattr(reg.collector, "crash", None)
            if crash is not None:
                written.extend(self._guard(reg, "crash", lambda c=crash: c(exc)) or [])
        return written + self.dump()

    def current_step(self) -> int | None:
        """The training step from ``step_fn``, or ``None`` when unknown."""
        if self.step_fn is None:
            return None
        try:
            return int(self.step_fn())
        except Exception:
            return None

    def counted_functions(self) -> frozenset[str]:
        """Every ``@memprofilable`` function counted so far."""
        return frozenset(self._calls)

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
            self._warn(f"internal error while starting `{fn_name}` call {call}: {err!r}; skipping it")
            return None

    def _begin(self, fn_name: str, call: int, module: nn.Module | None) -> _Run | None:
        sched = self.config.schedule
        act = schedule.action(sched, call)
        if schedule.is_finished(sched, call) and not act.collects:
            self._finished.add(fn_name)
        if act is schedule.Action.NONE:
            return None
        regs = [r for r in self._collectors if fn_name in r.funcs]
        ctx = CallContext(
            fn_name=fn_name,
            call=call,
            rank=self.rank,
            module=module if module is not None else self.module,
            closes_window=schedule.closes_window(sched, call),
        )
        if act is schedule.Action.WARMUP:
            for reg in regs:
                warmup = getattr(reg.collector, "warmup", None)
                if warmup is not None:
                    self._guard(reg, "warmup", lambda w=warmup: w(ctx))
            return None
        if self._active is not None:
            self._warn(
                f"`{fn_name}` was called inside collected `{self._active.ctx.fn_name}`; "
                "nested calls are counted but not collected"
            )
            return None
        run = _Run(ctx, regs)
        metrics: dict[str, Any] = {}
        for reg in regs:
            out = self._guard(reg, "start", lambda r=reg: r.collector.start(ctx))
            if out is not None:
                run.started.append(reg)
                metrics.update(out)
        self._record("start", metrics, ctx)
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
        metrics: dict[str, Any] = {}
        for reg in reversed(run.started):
            out = self._guard(reg, "end", lambda r=reg: r.collector.end(ctx, ok))
            if out is not None:
                metrics.update(out)
        if not ok:
            metrics["failed"] = True
        self._record("end", metrics, ctx, t_ns=t_end)
        if ok and any(hasattr(reg.collector, "step_end") for reg in run.started):
            self._step_open = True
        if schedule.is_finished(self.config.schedule, ctx.call):
            self._finished.add(ctx.fn_name)
        if ctx.closes_window:
            # Write what the window collected now, so a process killed later (the host OOM
            # killer sends SIGKILL) still leaves it on disk. One small write per window.
            if self._step_open:
                self._dump_after_step = True
            else:
                self.dump()

    def call_count(self, fn_name: str) -> int:
        """How many calls of ``fn_name`` have been counted."""
        return self._calls.get(fn_name, 0)

    # ----------------------------------------------------------------- output
    def dump(self) -> list[Path]:
        """Write every enabled output file atomically; safe to call repeatedly.

        Never raises: a write failure is a warning, and whatever else can be written is.
        """
        if not self._is_setup:
            return []
        self.step_end()
        written: list[Path] = []
        cfg = self.config
        writers: list[tuple[str, Callable[[], Path]]] = []
        yaml_path = self.save_dir / layout.MEMORY_STATS_YAML.format(rank=self.rank)
        pickle_path = self.save_dir / layout.MEMORY_STATS_PICKLE.format(rank=self.rank)
        if cfg.dump_memorystats_yaml:
            cache = self._snapshot_cache
            writers.append((yaml_path.name, lambda: write_text(yaml_path, cache.yaml_text(self.snapshots))))
        if cfg.dump_memorystats_pickle:
            writers.append(
                (
                    pickle_path.name,
                    lambda: write_pickle(
                        pickle_path, self._snapshot_cache.plain(self.snapshots), plain=False
                    ),
                )
            )
        timeline = self.timeline
        if timeline is not None:
            writers.append(("the memory trace", lambda: timeline.dump(self.save_dir)))
        for what, write in writers:
            try:
                written.append(write())
            except Exception as err:  # each file on its own: one failure must not cost the others
                self._warn(f"could not write {what} in {self.save_dir}: {err!r}", all_ranks=True)
        for reg in self._collectors:
            dump = getattr(reg.collector, "dump", None)
            if dump is not None:
                files = self._guard(reg, "dump", lambda d=dump: d(self.save_dir, self.rank))
                written.extend(files or [])
        return written

    # ----------------------------------------------------------------- faults
    def _warn(self, message: str, all_ranks: bool = False) -> None:
        warn_once(message, rank=self.rank, all_ranks=all_ranks)

    def _guard(
        self, reg: Registered, what: str, fn: Any, reraise: tuple[type[BaseException], ...] = ()
    ) -> Any:
        """Run a collector step; on failure warn, switch that collector off, return None.

        Exceptions of the types in ``reraise`` (the user's mistakes) propagate unchanged.
        """
        try:
            return fn()
        except reraise:
            raise
        except Exception as err:
            name = getattr(reg.collector, "name", type(reg.collector).__name__)
            log.debug("collector %s failed in %s", name, what, exc_info=True)
            self._warn(
                f"collector `{name}` failed in {what} ({err!r}); it is switched off, training continues"
            )
            if reg in self._collectors:
                self._collectors.remove(reg)
                with suppress(Exception):
                    reg.collector.close()
            return None


def check_writable(path: Path) -> None:
    """Create ``path`` if needed and prove a file can be written in it.

    Raises:
        ArtifactError: naming the directory and the fix.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".memprofiler-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ArtifactError(
            f"`save_dir` {str(path)!r} is not writable ({err.strerror or err}); "
            "choose a writable directory with `save_dir: ...`"
        ) from None
