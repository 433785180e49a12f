"""Bytes autograd saves for backward inside a collected call, counted correctly.

``saved_tensors.unique_bytes`` counts each storage once, by the storage's full size, and
excludes storages of parameters and buffers and views of them (``weight.t()``): those are
resident anyway and are not activation memory. ``saved_tensors.packed_bytes`` sums every
pack call's storage bytes for non-``Parameter`` tensors: the ancestor's "npp" figure,
which over-counts (views of weights, one storage saved by several ops).

The hooks wrap the whole call from the outside: inside a non-reentrant checkpoint region
the checkpoint's own hooks take precedence, so what checkpointing saves is unchanged and
what it keeps for recomputation (its inputs) is what we see. The pack hook returns a
detached alias, never the tensor itself: returning an output tensor would keep it alive
through a reference cycle with its own ``grad_fn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from memprofiler.collectors.base import CallContext
from memprofiler.collectors.module_tracker import ModuleStack

_StorageKey = tuple[str, int]


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # DTensor (FSDP2 shards)
    return to_local() if callable(to_local) else t


def _storage_key(t: torch.Tensor) -> tuple[_StorageKey, torch.UntypedStorage] | None:
    try:
        st = _local(t).untyped_storage()
        ptr = st.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if ptr == 0:
        return None
    return (str(st.device), ptr), st


class SavedTensorsCollector:
    """Collects ``saved_tensors.{unique_bytes,packed_bytes,count,by_module}`` at end."""

    name = "saved_tensors"

    def __init__(self) -> None:
        self.packed_bytes = 0
        self.unique_bytes = 0
        self.count = 0
        self._by_module: dict[str, int] = {}
        self._seen: dict[_StorageKey, StorageWeakRef] = {}
        self._excluded: set[_StorageKey] = set()
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._stack: ModuleStack | None = None

    def _exclude_module_tensors(self, module: nn.Module, recurse: bool) -> None:
        for t in (*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)):
            found = _storage_key(t)
            if found is not None:
                self._excluded.add(found[0])

    def _on_enter(self, module: nn.Module, label: str, depth: int, args: tuple[Any, ...]) -> None:
        # FSDP2 swaps in unsharded parameters just before forward: exclude them here.
        for p in module._parameters.values():
            if p is not None:
                found = _storage_key(p)
                if found is not None:
                    self._excluded.add(found[0])

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.count += 1
        is_param = isinstance(t, nn.Parameter)
        found = _storage_key(t)
        if found is None:
            return t.detach()
        key, st = found
        if not is_param:
            self.packed_bytes += st.nbytes()
        if is_param or isinstance(t._base, nn.Parameter) or key in self._excluded:
            return t.detach()
        prev = self._seen.get(key)
        if prev is None or prev.expired():
            self._seen[key] = StorageWeakRef(st)
            n = st.nbytes()
            self.unique_bytes += n
            owner = self._stack.current if self._stack is not None else "(outside forward)"
            self._by_module[owner] = self._by_module.get(owner, 0) + n
        return t.detach()

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self.packed_bytes = self.unique_bytes = self.count = 0
        self._by_module = {}
        self._seen = {}
        self._excluded = set()
        if ctx.module is not None:
            self._exclude_module_tensors(ctx.module, recurse=True)
            # Parameters only change storage mid-forward when they are sharded (DTensor):
            # skip the per-module re-check otherwise, it is the costliest part of the hooks.
            sharded = any(callable(getattr(p, "to_local", None)) for p in ctx.module.parameters())
            self._stack = ModuleStack(ctx.module, on_enter=self._on_enter if sharded else None)
            self._stack.install()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        self._release()
        return {
            "saved_tensors.unique_bytes": self.unique_bytes,
            "saved_tensors.packed_bytes": self.packed_bytes,
            "saved_tensors.count": self.count,
            "saved_tensors.by_module": dict(sorted(self._by_module.items(), key=lambda kv: -kv[1])),
        }

    def _release(self) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
        if self._stack is not None:
            self._stack.remove()
            self._stack = None
        self._seen = {}
        self._excluded = set()

    def close(self) -> None:
        self._release()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
