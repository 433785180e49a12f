"""FSDP2 module-wise memory (``track_fsdp_mem``), with PyTorch's ``FSDPMemTracker``.

``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` extends ``MemTracker`` to FSDP2:
it sorts storages into Sharded/Unsharded Param, Buffer, Sharded/Unsharded Grad, Activation,
Temp, All Gather, Reduce Scatter, OptState and Inputs, with snapshots at the FSDP pre/post
forward and backward hooks of every ``fully_shard``-ed module under the root.

Here the tracker

* covers the step of each collected call (see :mod:`memprofiler.collectors.tracker_window`);
* tracks *every* optimizer given by :meth:`MemProfiler.bind` (PyTorch's tracker takes one);
* checks at bind time that the root module exists and is ``fully_shard``-ed.

Under Lightning's automatic optimization ``training_step`` runs inside ``optimizer.step``, so
the step's pre-hook has already fired when the window opens: temporaries of the optimizer
update are counted as Temp/Activation, while the optimizer *state* is counted as OptState
(it is registered when the window opens and re-labelled by the step's post-hook).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn

from memprofiler import layout
from memprofiler.collectors.base import Warn
from memprofiler.collectors.faults import no_warn
from memprofiler.collectors.tracker_window import TrackerCollector
from memprofiler.errors import ConfigError
from memprofiler.tracker_hooks import DeadModulesSkipped

_KEY = "fsdp_mem_tracker_root_module"
_MAX_LISTED = 20


def fsdp_module_paths(module: nn.Module) -> list[str]:
    """Dotted paths (``""`` for ``module`` itself) of every ``fully_shard``-ed module under ``module``."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name, mod in module.named_modules() if isinstance(mod, FSDPModule)]


def resolve_root(module: nn.Module | None, path: str) -> nn.Module:
    """Return the ``fully_shard``-ed submodule of ``module`` at dotted ``path``.

    Raises:
        ConfigError: ``module`` is None, the path does not exist, or the module there is not
            ``fully_shard``-ed. One line, naming the path and listing the FSDP module paths.

    Example:
        >>> resolve_root(lightning_module, "model")  # doctest: +SKIP
    """
    from torch.distributed.fsdp import FSDPModule

    if module is None:
        raise ConfigError(_KEY, f"cannot resolve {path!r}: no module is being profiled")
    shown = repr(path) if path else '"" (the profiled module itself)'
    try:
        target = module.get_submodule(path) if path else module
    except AttributeError:
        raise ConfigError(
            _KEY, f"{shown} is not a submodule of {type(module).__name__}; {_listing(module)}"
        ) from None
    if not isinstance(target, FSDPModule):
        raise ConfigError(
            _KEY, f"{shown} ({type(target).__name__}) is not fully_shard-ed; {_listing(module)}"
        )
    return target


def _listing(module: nn.Module) -> str:
    paths = fsdp_module_paths(module)
    if not paths:
        return (
            "no module is fully_shard-ed (apply `fully_shard` in `configure_model`, e.g. under "
            "ModelParallelStrategy, or turn `track_fsdp_mem` off)"
        )
    shown = [repr(p) for p in paths[:_MAX_LISTED]]
    more = f" and {len(paths) - _MAX_LISTED} more" if len(paths) > _MAX_LISTED else ""
    return f"fully_shard-ed module paths: {', '.join(shown)}{more}"


@functools.cache
def _tracker_class() -> type:
    # Imported lazily: the FSDP tracker pulls in DTensor and fake collectives.
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType

    class _FSDPTracker(DeadModulesSkipped, FSDPMemTracker):
        """``FSDPMemTracker`` over several optimizers, surviving a repeated root forward."""

        repeated_forward = False

        def __init__(self, mod: nn.Module, optimizers: list[Any]) -> None:
            super().__init__(mod, optimizers[0] if optimizers else None)
            self._optms = optimizers

        def _instrument_optimizer(self) -> None:
            def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
                self._in_opt = True

            def post(optimizer: Any, args: Any, kwargs: Any) -> None:
                self._track_optimizer_states(_FSDPRefType.OPT, optimizer)
                self._in_opt = False

            handles = []
            for opt in self._optms:
                self._track_optimizer_states(_FSDPRefType.OPT, opt)
                handles += [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)]
            # The parent removes whatever handles this tuple holds when the tracker exits.
            self._optimizer_hook_handles = tuple(handles) or None

        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Callable[..., Any]) -> Callable[..., Any]:
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            @functools.wraps(inner)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                try:
                    return inner(*args, **kwargs)
                except NotImplementedError:
                    # A second root-level forward in one window: restart the module stats
                    # rather than break the user's step (the check runs before any state
                    # changes, so retrying is safe).
                    self.repeated_forward = True
                    self.reset_mod_stats()
                    return inner(*args, **kwargs)

            return guarded

    return _FSDPTracker


class FSDPMemCollector(TrackerCollector):
    """Runs ``FSDPMemTracker`` over the step of collected calls; writes ``fsdp_mem_rank_*`` reports.

    Snapshot keys (``.end``): ``fsdp.peak.{sharded_param,unsharded_param,buffer,sharded_grad,
    unsharded_grad,activation,temp,all_gather,reduce_scatter,optstate,inputs,total}`` in bytes
    for the device training uses, and ``fsdp.peak_device``.

    Args:
        root_path: ``fsdp_mem_tracker_root_module``.
        depth: ``module_mem_depth``.
        units: ``module_mem_units``.
        tabulate: ``module_mem_tabulate``.
    """

    name = "fsdp"
    tracker_name = "FSDPMemTracker"
    prefix = "fsdp"
    report_name = layout.FSDP_MEM_REPORT

    def __init__(
        self,
        root_path: str = "",
        depth: int = 2,
        units: str = "MiB",
        tabulate: bool = False,
        warn: Warn = no_warn,
    ) -> None:
        super().__init__(depth=depth, units=units, tabulate=tabulate, warn=warn)
        self.root_path = root_path

    def _resolve(self, module: nn.Module | None) -> nn.Module:
        return resolve_root(module, self.root_path)

    def _tracker_type(self) -> type:
        return _tracker_class()

    def _new_tracker(self) -> Any:
        return _tracker_class()(self.root, self.optimizers)
