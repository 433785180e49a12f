"""Collector dispatch: every collector event goes through here, each guarded on its own.

A collector that raises is warned about once, switched off and closed; the call, the step and
the other collectors go on. User mistakes (``MemProfilerError`` from ``bind_model``) are the
one exception that propagates: they must stop a run before training, with their one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from memprofiler.collectors.base import CallContext, CallId, Metrics, ProfilerView
from memprofiler.collectors.registry import Registered
from memprofiler.errors import MemProfilerError, log

T = TypeVar("T")


class CollectorSet:
    """The collectors a config enabled, in start order (they end in reverse).

    Args:
        registered: collectors and the functions each collects.
        warn: the profiler's warn-once.
    """

    def __init__(self, registered: Sequence[Registered], warn: Callable[..., None]) -> None:
        self._regs = list(registered)
        self._warn = warn

    def __iter__(self) -> Any:
        return iter(list(self._regs))

    def for_function(self, fn_name: str) -> list[Registered]:
        return [r for r in self._regs if fn_name in r.funcs]

    def collects(self, fn_name: str) -> bool:
        return any(fn_name in r.funcs for r in self._regs)

    # ------------------------------------------------------------------ events
    def bind(self, view: ProfilerView) -> None:
        for reg in list(self._regs):
            self._guard(reg, "bind", reg.collector.bind, view)

    def bind_model(self, module: nn.Module | None, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        for reg in list(self._regs):
            self._guard(
                reg,
                "bind_model",
                reg.collector.bind_model,
                module,
                optimizers,
                reraise=(MemProfilerError,),
            )

    def warmup(self, regs: Sequence[Registered], ctx: CallContext) -> None:
        for reg in regs:
            self._guard(reg, "warmup", reg.collector.warmup, ctx)

    def start(self, regs: Sequence[Registered], ctx: CallContext) -> tuple[list[Registered], Metrics]:
        """Start ``regs`` for a call; return those that started and their merged metrics."""
        started: list[Registered] = []
        metrics: Metrics = {}
        for reg in regs:
            out = self._guard(reg, "start", reg.collector.start, ctx)
            if out is not None:
                started.append(reg)
                metrics.update(out)
        return started, metrics

    def end(self, started: Sequence[Registered], ctx: CallContext, ok: bool) -> Metrics:
        metrics: Metrics = {}
        for reg in reversed(started):
            out = self._guard(reg, "end", reg.collector.end, ctx, ok)
            if out is not None:
                metrics.update(out)
        return metrics

    def step_end(self) -> dict[CallId, Metrics]:
        """Close step-long windows; the late metrics per call, merged over collectors."""
        merged: dict[CallId, Metrics] = {}
        for reg in list(self._regs):
            if not reg.collector.spans_step:
                continue
            out: Mapping[CallId, Metrics] | None = self._guard(reg, "step_end", reg.collector.step_end)
            for call_id, metrics in (out or {}).items():
                merged.setdefault(call_id, {}).update(metrics)
        return merged

    def dump(self) -> list[Path]:
        written: list[Path] = []
        for reg in list(self._regs):
            written.extend(self._guard(reg, "dump", reg.collector.dump) or [])
        return written

    def crash(self, exc: BaseException) -> list[Path]:
        written: list[Path] = []
        for reg in list(self._regs):
            written.extend(self._guard(reg, "crash", reg.collector.crash, exc) or [])
        return written

    def close(self) -> None:
        for reg in list(self._regs):
            self._guard(reg, "close", reg.collector.close)

    # ------------------------------------------------------------------ faults
    def _guard(
        self,
        reg: Registered,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        reraise: tuple[type[BaseException], ...] = (),
    ) -> T | None:
        """Run one collector event; on failure warn, switch that collector off, return None."""
        try:
            return fn(*args)
        except reraise:
            raise
        except Exception as err:
            name = reg.collector.name
            log.debug("collector %s failed in %s", name, what, exc_info=True)
            self._warn(
                f"collector `{name}` failed in {what} ({err!r}); it is switched off, training continues"
            )
            if reg in self._regs:
                self._regs.remove(reg)
                with suppress(Exception):
                    reg.collector.close()
            return None
