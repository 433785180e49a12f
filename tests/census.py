"""The independent oracle of the estimate's accuracy: live tensor bytes over real steps.

A ``TorchDispatchMode`` that knows nothing of the estimate's tracker counts every storage an op
returns once, from the op until the storage is freed (a weak-reference callback), plus what was
alive before (parameters, buffers, the batch). Its peak is the measured peak of live tensor
bytes that the CPU estimate must equal (``tests/estimate``, ``benchmarks/estimate_accuracy.py``).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes:
    """Live tensor storages, each counted once, and the most there were at an op's end."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.total = 0
        self.peak = 0

    def add(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        to_local = getattr(t, "to_local", None)
        if callable(to_local):  # a DTensor: this rank's shard is what it holds
            t = to_local()
        st = t.untyped_storage()
        try:
            st.data_ptr()
        except RuntimeError:  # no storage of its own (a functional collective's autograd wrapper)
            return
        key = st._cdata
        if key in self.live:
            return
        n = st.nbytes()
        self.live[key] = n
        self.total += n
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.total -= self.live.pop(key, 0)

    def mode(self, after_op: Callable[[], None] | None = None) -> TorchDispatchMode:
        """Counts each op's outputs and keeps the peak; ``after_op`` runs after every op."""
        census = self

        class _Census(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    census.add(t)
                census.peak = max(census.peak, census.total)
                if after_op is not None:
                    after_op()
                return out

        return _Census()


def census_peak(
    model: nn.Module, batch: Any, optimizer: torch.optim.Optimizer, loss_fn: Any, steps: int = 2
) -> int:
    """The most bytes of live tensor storages over ``steps`` real steps: the model's, the
    optimizer's and the batch's, and every op's outputs."""
    gc.collect()
    census = LiveBytes()
    for t in [*model.parameters(), *model.buffers(), *tree_leaves(batch)]:
        census.add(t)
    census.peak = census.total
    with census.mode():
        for _ in range(steps):
            loss = loss_fn(model, batch)  # held through the optimizer step, as Lightning holds it
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            del loss
    return census.peak
