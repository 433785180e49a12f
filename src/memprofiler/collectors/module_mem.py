"""Module-wise memory without FSDP (``track_module_mem``), with PyTorch's ``MemTracker``.

``torch.distributed._tools.mem_tracker.MemTracker`` is a ``TorchDispatchMode``: it sees every
tensor created while it is entered and sorts storages into Parameter, Buffer, Gradient,
Activation, Temp and Optstate, per device (CPU and CUDA), with snapshots at each module's
forward and backward boundaries. It costs about 2x a step on CPU, so it is entered only in
the collection window (see :mod:`memprofiler.collectors.tracker_window`).

What it counts: storages it has seen (created in the window, or registered at its start:
the profiled module's parameters, buffers and gradients, and every optimizer's state).
Tensors created before the window and not registered (e.g. the batch) are not counted.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from memprofiler import layout
from memprofiler.collectors.tracker_window import TrackerCollector
from memprofiler.errors import ConfigError
from memprofiler.tracker_hooks import DeadModulesSkipped


@functools.cache
def _tracker_class() -> type:
    # Imported lazily: torch.distributed._tools pulls in DTensor and friends.
    from torch.distributed._tools.mem_tracker import MemTracker

    class _MemTracker(DeadModulesSkipped, MemTracker):
        """``MemTracker`` that survives a second forward of the root module in one window."""

        repeated_forward = False

        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:
                # A second root-level forward in the same step (e.g. two forward passes in
                # training_step). The tracker refuses it; restart the module stats instead of
                # breaking the user's step.
                self.repeated_forward = True
                self.reset_mod_stats()
                super()._pre_fw_hook(module, inputs)

    return _MemTracker


class ModuleMemCollector(TrackerCollector):
    """Runs ``MemTracker`` over the step of collected calls; writes ``module_mem_rank_*`` reports.

    Snapshot keys (``.end``): ``module_mem.peak.{parameter,buffer,gradient,activation,temp,
    optstate,other,total}`` in bytes for the device training uses, and ``module_mem.peak_device``.
    """

    name = "module_mem"
    tracker_name = "MemTracker"
    prefix = "module_mem"
    report_name = layout.MODULE_MEM_REPORT

    def _resolve(self, module: nn.Module | None) -> nn.Module:
        if module is None:
            raise ConfigError(
                "track_module_mem",
                "no module to track: pass `module=` to `MemProfiler.setup`/`profile` or use the callback",
            )
        return module

    def _tracker_type(self) -> type:
        return _tracker_class()

    def _new_tracker(self) -> Any:
        return _tracker_class()()

    def _before_enter(self, tracker: Any) -> None:
        # Parameters, buffers, existing gradients and optimizer state were created before the
        # window; the tracker only knows them if told. Its global optimizer-step hooks then
        # cover every optimizer.
        tracker.track_external(self.root, *self.optimizers)
