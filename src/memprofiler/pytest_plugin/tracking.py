"""The project's saved-tensor counter, adapted to a test body: no model is known in advance.

A test builds its model inside its body, so the module tree cannot be labelled up front as
``MemProfiler.profile(module=...)`` does. :class:`AnyRootStack` labels a module tree the
first time its outermost module runs; :class:`BodySavedTensors` uses it for the per-module
breakdown and, for the leak check, keeps a weak reference to every alias autograd stores.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from memprofiler.collectors.base import CallContext
from memprofiler.collectors.module_tracker import ModuleStack, module_labels
from memprofiler.collectors.saved_tensors import SavedTensorsCollector


class AnyRootStack(ModuleStack):
    """A :class:`ModuleStack` over whatever modules run: an outermost module's tree is
    labelled (``(root)``, ``net.0``, ...) when it first runs; a stray module nested in another
    tree is labelled by its class name."""

    def __init__(self) -> None:
        super().__init__(nn.Module())
        # id -> weak reference, so an id reused by a later module is relabelled.
        self._refs: dict[int, weakref.ref[nn.Module]] = {}

    def _pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        ref = self._refs.get(id(module))
        if ref is None or ref() is not module:
            tree = module_labels(module) if not self.stack else {id(module): type(module).__name__}
            mods = {id(m): m for m in module.modules()} if not self.stack else {id(module): module}
            self._labels.update(tree)
            for key in tree:
                self._refs[key] = weakref.ref(mods[key])
        super()._pre(module, args)


class BodySavedTensors(SavedTensorsCollector):
    """:class:`SavedTensorsCollector` with a per-module breakdown for modules built in the test.

    Args:
        track_alive: keep a weak reference to each saved activation alias, so that what is
            still alive after the test (a graph kept by a ``loss`` in a list) can be found.
    """

    def __init__(self, track_alive: bool = False) -> None:
        super().__init__()
        self._track = track_alive
        #: (alias, storage address, storage bytes, module that saved it) per saved activation.
        self.saved: list[tuple[weakref.ref[torch.Tensor], int, int, str]] = []

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self.saved = []
        out = super().start(ctx)  # ctx.module is None: hooks only, no module stack
        stack = AnyRootStack()
        stack.install()
        self._stack = stack
        return out

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        out = super()._pack(t)
        # A tensor with history is stored as a fresh alias that only the graph holds: while the
        # alias lives, so does the graph that saved it.
        if self._track and out is not t and t.grad_fn is not None:
            try:
                st = out.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                return out
            key = st.data_ptr()
            if key in self._seen:  # an activation the counter counted, not a view of a weight
                owner = self._stack.current if self._stack is not None else "(outside forward)"
                self.saved.append((weakref.ref(out), key, st.nbytes(), owner))
        return out

    def alive(self) -> tuple[int, int, dict[str, int]]:
        """``(tensors, bytes, bytes by module)`` of saved activations still alive, storages once."""
        count, seen, by_module = 0, set(), dict[str, int]()
        for ref, key, nbytes, owner in self.saved:
            if ref() is None:
                continue
            count += 1
            if key not in seen:
                seen.add(key)
                by_module[owner] = by_module.get(owner, 0) + nbytes
        return count, sum(by_module.values()), dict(sorted(by_module.items(), key=lambda kv: -kv[1]))
