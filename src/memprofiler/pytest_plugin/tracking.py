"""The project's saved-tensor counter, adapted to a test body: no model is known in advance.

A test builds its model inside its body, so the module tree cannot be labelled up front as
``MemProfiler.profile(module=...)`` does. :class:`BodySavedTensors` labels a module tree the
first time its outermost module saves something (``(root)``, ``net.0``, ...), found on the
call stack as the collector finds modules, and, for the leak check, keeps a weak reference to
every holder autograd stores.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from memprofiler.collectors.base import CallContext
from memprofiler.collectors.module_tracker import OUTSIDE_NAME, module_labels
from memprofiler.collectors.saved_tensors import SavedTensorsCollector

_CALL = nn.Module._wrapped_call_impl.__code__


class BodySavedTensors(SavedTensorsCollector):
    """:class:`SavedTensorsCollector` with a per-module breakdown for modules built in the test.

    Args:
        track_alive: keep a weak reference to each saved activation's holder, so that what is
            still alive after the test (a graph kept by a ``loss`` in a list) can be found.
    """

    def __init__(self, track_alive: bool = False) -> None:
        # The Python pack hook: the leak check reads its per-storage lists (owner first).
        super().__init__(compiled=False)
        self._track = track_alive
        #: (holder, storage key, storage bytes, module that saved it) per saved activation.
        self.saved: list[tuple[weakref.ref[Any], int, int, str]] = []
        # id of an outermost module -> (weak reference, its tree's labels)
        self._trees: dict[int, tuple[weakref.ref[nn.Module], dict[int, str]]] = {}

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self.saved = []
        return super().start(ctx)  # ctx.module is None: modules are labelled as they save

    def _owner(self, frame: Any) -> str:
        inner = outer = None
        while frame is not None:
            if frame.f_code is _CALL:
                module = frame.f_locals.get("self")
                if inner is None:
                    inner = module
                outer = module
            frame = frame.f_back
        if inner is None or outer is None:
            return OUTSIDE_NAME
        tree = self._trees.get(id(outer))
        if tree is None or tree[0]() is not outer:  # an id reused by a later module is relabelled
            tree = (weakref.ref(outer), module_labels(outer))
            self._trees[id(outer)] = tree
        return tree[1].get(id(inner), type(inner).__name__)

    def _pack(self, t: torch.Tensor) -> Any:
        out = super()._pack(t)
        # A tensor with history is stored in a holder that only the graph holds: while the
        # holder lives, so does the graph that saved it.
        if self._track and t.grad_fn is not None:
            try:
                st = out.t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                return out
            key = st._cdata
            held = self._p.held.get(key)
            if held is not None:  # an activation the counter counted, not a view of a weight
                self.saved.append((weakref.ref(out), key, st.nbytes(), held[0]))
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
