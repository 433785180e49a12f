"""``ProfilerHooksMixin``: the ancestor's style, a ``memprofiler_cfg`` init argument."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.callbacks import Callback

from memprofiler.config import MemProfilerConfig
from memprofiler.lightning import _compat as compat
from memprofiler.lightning.callback import MemProfilerCallback, refuse_second_profiler


class ProfilerHooksMixin:
    """Mix into a LightningModule to configure profiling from its own init arguments.

    The module's ``configure_callbacks`` then returns a :class:`MemProfilerCallback` built
    from ``memprofiler_cfg``, so no trainer change is needed.

    Args:
        memprofiler_cfg: a :class:`~memprofiler.MemProfilerConfig` or mapping; ``None``
            leaves profiling off.

    Example:
        >>> class Model(ProfilerHooksMixin, LightningModule):  # doctest: +SKIP
        ...     def __init__(self, memprofiler_cfg=None):
        ...         super().__init__(memprofiler_cfg=memprofiler_cfg)
    """

    def __init__(
        self, *args: Any, memprofiler_cfg: MemProfilerConfig | Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.memprofiler_cfg = (
            None if memprofiler_cfg is None else MemProfilerConfig.from_any(memprofiler_cfg)
        )

    def configure_callbacks(self) -> list[Callback] | Callback:
        parent = getattr(super(), "configure_callbacks", None)
        base = parent() if parent is not None else []
        callbacks = list(base) if isinstance(base, (list, tuple)) else [base]
        if self.memprofiler_cfg is not None and self.memprofiler_cfg.enabled:
            trainer = compat.attached_trainer(self)
            held = list(getattr(trainer, "callbacks", []))
            # One callback per Trainer for every stage: a fresh one for `validate` after `fit`
            # would start a new profiler and overwrite the fit's files. Ours is the one built
            # on this very config object.
            own = next(
                (
                    cb
                    for cb in held
                    if isinstance(cb, MemProfilerCallback) and cb.config is self.memprofiler_cfg
                ),
                None,
            )
            if own is None:
                own = MemProfilerCallback(self.memprofiler_cfg)
                own.origin = f"`memprofiler_cfg` of `{type(self).__name__}` (`ProfilerHooksMixin`)"
            # Lightning would silently drop a Trainer's callback of the same class in favour of
            # this one: refuse the pair now, while both are visible.
            refuse_second_profiler([*callbacks, *held], own)
            callbacks.append(own)
        return callbacks
