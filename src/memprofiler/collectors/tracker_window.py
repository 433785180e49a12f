"""The collection window shared by the module-wise dispatch-mode trackers.

``FSDPMemTracker`` and ``MemTracker`` only see what runs while they are entered. Under
Lightning's automatic optimization ``training_step`` is only the forward: backward and the
optimizer update run after it returns (``training_step`` itself runs inside
``optimizer.step(closure)``). A tracker around ``training_step`` alone would miss gradients,
reduce-scatter buffers and the optimizer step, so the window is:

* entered at the start of a collected call (``start``);
* left at the end of the *step*: :meth:`MemProfiler.step_end`, which the Lightning callback
  calls from ``on_train_batch_end`` (after ``optimizer.step`` and ``zero_grad``), or at the
  next profiled call, or at ``dump``, whichever comes first;
* left at once when the call raises.

One tracker lives for one schedule window (consecutive collected calls). Its module stats
are cleared with ``reset_mod_stats()`` before each call, which the trackers require (a second
forward of the root module otherwise raises ``NotImplementedError``). The tracker is dropped
when the schedule window closes, so nothing of it (not even its weak-reference callbacks on
freed storages) costs anything outside the window.

While a window is open torch's module tracker registers its backward hooks through
:func:`memprofiler.tracker_hooks.gradient_free_module_hooks`: torch's own hooks hold each module
input's gradient until the module's last input has one, and keep a leaf input (and its
gradient) alive as long as the hook, so the profiled step would hold memory an unprofiled one
does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprofiler.collectors import mem_report
from memprofiler.collectors.base import BaseCollector, CallContext, CallId, Metrics, ProfilerView, Warn
from memprofiler.collectors.faults import no_warn
from memprofiler.output.writers import write_text, write_yaml
from memprofiler.tracker_hooks import gradient_free_module_hooks

WINDOW_TEXT = (
    "from the start of `{fn}` to the end of its step (backward and optimizer step included, "
    "when they run before the step ends)"
)

REPEATED_FORWARD_NOTE = (
    "the root module ran forward more than once in this window; module-wise snapshots cover "
    "the last forward, the peak covers the whole window"
)


def training_device(module: nn.Module | None) -> str | None:
    """The device holding most of ``module``'s parameter bytes, named as the trackers name
    devices (``cuda:0``, ``cpu``); read when a window closes, so a model moved to the GPU
    after set-up is seen where it trains. ``None`` without parameters."""
    if module is None:
        return None
    per_device: dict[str, int] = {}
    for param in module.parameters():
        dev = str(param.device)
        per_device[dev] = per_device.get(dev, 0) + param.numel() * param.element_size()
    return max(per_device, key=lambda dev: per_device[dev]) if per_device else None


class TrackerCollector(BaseCollector):
    """Runs a module-wise memory tracker over a step-long window and writes its reports.

    Subclasses set ``name``, ``tracker_name``, ``prefix`` (snapshot key prefix), ``report_name`` (a
    :mod:`memprofiler.layout` format) and implement :meth:`_resolve` and :meth:`_new_tracker`.

    Args:
        depth: deepest module level in the module-wise snapshots.
        units: units of the ``.log`` report.
        tabulate: render the ``.log`` as tables.
    """

    name = "tracker"
    spans_step = True
    tracker_name = "MemTracker"
    prefix = "tracker"
    report_name = ""

    def __init__(
        self, depth: int = 2, units: str = "MiB", tabulate: bool = False, warn: Warn = no_warn
    ) -> None:
        self.depth = depth
        self._warn = warn
        self.units = units
        self.tabulate = tabulate
        self.root: nn.Module | None = None
        self.profiled: nn.Module | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self._bound = False
        self._tracker: Any = None
        self._open: CallContext | None = None
        self._hooks: contextlib.ExitStack | None = None
        self._pending: dict[str, dict[str, Any]] = {}
        self._view: ProfilerView | None = None

    def bind(self, view: ProfilerView) -> None:
        self._view = view

    # ----------------------------------------------------------------- binding
    def bind_model(self, module: nn.Module | None, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Resolve the tracked module and keep every optimizer.

        Raises:
            ConfigError: the module to track cannot be resolved (see :meth:`_resolve`).
        """
        self.root = self._resolve(module)
        self.profiled = module
        self.optimizers = list(optimizers)
        self._tracker = None
        self._bound = True
        # Imported now, before any step: a module imported inside a step the PyTorch profiler
        # traces with Python stacks has its code freed before torch reads the frames' names,
        # which garbles them (torch 2.13 then loses that cycle's summary table).
        self._tracker_type()

    def _resolve(self, module: nn.Module | None) -> nn.Module:
        raise NotImplementedError

    def _tracker_type(self) -> type:
        """The tracker's class (importing its module)."""
        raise NotImplementedError

    def _new_tracker(self) -> Any:
        raise NotImplementedError

    def _name_modules(self, tracker: Any) -> None:
        # Name modules from the profiled module down (``DemoGPT.model.blocks.0``, the paths of
        # ``fsdp_mem_tracker_root_module`` under the LightningModule's class name), whichever
        # module the step calls first; depth 1 is the profiled module. Private ModTracker API,
        # hence the guard: without it names start at the first module called.
        with contextlib.suppress(Exception):
            tracker._mod_tracker._get_mod_name(self.profiled or self.root)

    def _before_enter(self, tracker: Any) -> None:
        """Register what existed before the window (parameters, optimizer state)."""

    # ----------------------------------------------------------------- window
    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        if self._open is not None:  # the previous step was never closed: close it now
            self.step_end()
        if not self._bound:
            self.bind_model(ctx.module, [])
        if self._tracker is None:
            self._tracker = self._new_tracker()
            self._name_modules(self._tracker)
        tracker = self._tracker
        tracker.reset_mod_stats()
        tracker.repeated_forward = False
        self._before_enter(tracker)
        hooks = contextlib.ExitStack()
        hooks.enter_context(gradient_free_module_hooks())
        try:
            tracker.__enter__()
        except BaseException:
            hooks.close()
            raise
        self._hooks = hooks
        self._open = ctx
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        if not ok:  # no step follows a failed call; keep what was tracked
            self._close(failed=True)
        return {}

    def step_end(self) -> dict[CallId, Metrics]:
        """Leave the tracker; return the ``.end`` snapshot metrics of the call it covered."""
        ctx = self._open
        if ctx is None:
            return {}
        report = self._close(failed=False)
        device = training_device(self.root)
        return {ctx.call_id: mem_report.peak_metrics(report["peak"], self.prefix, device)}

    def _close(self, failed: bool) -> dict[str, Any]:
        ctx, tracker = self._open, self._tracker
        assert ctx is not None and tracker is not None
        self._open = None
        try:
            tracker.__exit__(None, None, None)
        finally:
            if self._hooks is not None:
                self._hooks.close()
                self._hooks = None
            if ctx.closes_window or failed:
                self._tracker = None
        notes = []
        if getattr(tracker, "repeated_forward", False):
            notes.append(REPEATED_FORWARD_NOTE)
            self._warn(f"{self.name}: {REPEATED_FORWARD_NOTE}")
        if failed:
            notes.append(f"`{ctx.fn_name}` raised; the report covers the call up to the error")
        chains = mem_report.wrapper_chains(m.mod_fqn for m in tracker.memory_tracking.values())
        report = {
            "tracker": self.tracker_name,
            "rank": ctx.rank,
            "fn": ctx.fn_name,
            "call": ctx.call,
            "window": WINDOW_TEXT.format(fn=ctx.fn_name),
            "units": "B",
            "module_depth": self.depth,
            # where a chain of wrappers ends: the depth counts from there (mem_report.modulewise)
            **({"module_depth_from": sorted(chains.values())} if chains else {}),
            "notes": notes,
            "peak": mem_report.plain_snapshot(tracker.get_tracker_snapshot("peak")),
            "final": mem_report.plain_snapshot(tracker.get_tracker_snapshot("current")),
            "modules": mem_report.modulewise(tracker.memory_tracking, self.depth),
        }
        self._pending[self.report_name.format(rank=ctx.rank, fn=ctx.fn_name, call=ctx.call)] = report
        return report

    # ----------------------------------------------------------------- output
    def dump(self) -> list[Path]:
        """Write the reports of the calls closed since the last dump (``.yaml`` and ``.log``)."""
        written: list[Path] = []
        if self._view is None:
            return written
        save_dir = self._view.save_dir
        for stem, report in list(self._pending.items()):
            written.append(write_yaml(save_dir / f"{stem}.yaml", report))
            log = mem_report.render_log(report, self.units, self.tabulate)
            written.append(write_text(save_dir / f"{stem}.log", log))
            del self._pending[stem]
        return written

    def close(self) -> None:
        if self._open is not None:
            self._close(failed=False)
        self._tracker = None
