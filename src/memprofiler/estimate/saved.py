"""Bytes saved for backward in a fake step, by the definition of ``saved_tensors.unique_bytes``.

The rules are those of :mod:`memprofiler.collectors.saved_tensors`, so an estimate and a
measured run agree by construction: each storage counts once, by its full size; parameters,
buffers and views of parameters (``weight.t()``) do not count. Only the storage's identity
differs: a fake tensor has no address, so storages are keyed by the storage object itself
(held weakly, so a freed storage's successor counts anew, as a reused address does there).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    to_local = getattr(t, "to_local", None)  # DTensor (FSDP2 shards)
    if callable(to_local):
        t = to_local()
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class SavedBytes:
    """Counts ``unique_bytes`` and ``count`` of tensors saved while :meth:`hooks` is active."""

    def __init__(self, root: nn.Module) -> None:
        self.unique_bytes = 0
        self.count = 0
        self._seen = WeakIdKeyDictionary()
        self._excluded = WeakIdKeyDictionary()
        self._exclude(root.parameters())
        self._exclude(root.buffers())
        self._handle: Any = None

    def _exclude(self, tensors: Iterable[torch.Tensor | None]) -> None:
        for t in tensors:
            if t is not None:
                st = _storage(t)
                if st is not None:
                    self._excluded[st] = True

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        # FSDP2 swaps in unsharded parameters just before forward.
        self._exclude(module._parameters.values())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.count += 1
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return t.detach()
        st = _storage(t)
        if st is None or st in self._excluded or st in self._seen:
            return t if t.grad_fn is None else t.detach()
        self._seen[st] = True
        self.unique_bytes += st.nbytes()
        return t if t.grad_fn is None else t.detach()

    def reset(self) -> None:
        self.unique_bytes = self.count = 0
        self._seen = WeakIdKeyDictionary()

    def __enter__(self) -> SavedBytes:
        self._handle = nn.modules.module.register_module_forward_pre_hook(self._pre_forward)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(None, None, None)
        self._handle.remove()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
