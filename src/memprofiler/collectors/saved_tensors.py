"""Bytes autograd saves for backward inside a collected call, counted correctly.

``saved_tensors.unique_bytes`` counts each storage once, by the storage's full size, that is
still held for backward when the call saves its last tensor, and excludes storages of
parameters and buffers and views of them (``weight.t()``): those are resident anyway and are
not activation memory. A graph built and dropped earlier in the call adds nothing; the graph
the call ends with counts in full, also when the call itself then runs backward on it
(manual optimization) or its caller drops it. ``saved_tensors.packed_bytes`` sums every pack
call's storage bytes for non-``Parameter`` tensors: the ancestor's "npp" figure, which
over-counts (views of weights, one storage saved by several ops, dropped graphs).

The hooks wrap the whole call from the outside: inside a non-reentrant checkpoint region
the checkpoint's own hooks take precedence, so what checkpointing saves is unchanged and
what it keeps for recomputation (its inputs) is what we see. The pack hook returns a small
holder that only the graph references, so a weak reference to it dies with the graph and
records when (how many saves had happened). The holder keeps the saved tensor itself, as
autograd does for an input, except for an output saved by its own node (its ``grad_fn`` is
the newest node of the thread): that one is detached, as autograd detaches it, since it would
otherwise stay alive through a reference cycle with its ``grad_fn``. Storages are keyed by
their C storage object, which a live holder keeps from being reused within the call. The weak
references are dropped at the end of the call, so nothing of ours runs when backward frees
the graph.

Attribution needs no module hooks: the pack hook walks the Python frames above it to the
innermost ``nn.Module.__call__`` of a module of the profiled model, once per new storage.
Every module, of this model or any other, keeps ``nn.Module``'s hook-free fast path.

Cost inside the window (CPU, 1 thread, same FLOPs): see the README's overhead section and
``benchmarks/results/scaling_cpu.json``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from operator import attrgetter, itemgetter
from typing import Any
from weakref import ref

import torch
from torch import nn

from memprofiler.collectors.base import BaseCollector, CallContext
from memprofiler.collectors.faults import HookFaults, no_warn
from memprofiler.collectors.module_tracker import OUTSIDE_NAME, ModuleStack, module_labels

# `Module.__call__`: its frame has three locals, so reading `self` from it is cheap.
_CALL = nn.Module._wrapped_call_impl.__code__
PACK_PART = "collector `saved_tensors` pack hook"
TRACKER_PART = "collector `saved_tensors` module tracker"


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    if type(t) is not torch.Tensor:
        to_local = getattr(t, "to_local", None)  # DTensor (FSDP2 shards)
        if callable(to_local):
            t = to_local()
    try:
        st = t.untyped_storage()
        return st if st.data_ptr() else None
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _running_module(labels: dict[int, str], frame: Any) -> str:
    """Label of the innermost module of ``labels`` whose ``__call__`` is on the stack at ``frame``.

    ``Module.__call__`` runs for every module call, hooks or not, with the module as ``self``:
    the same module a forward pre-hook would have pushed, found a few frames up, without any
    hook on any module.
    """
    while frame is not None:
        if frame.f_code is _CALL:
            label = labels.get(id(frame.f_locals.get("self")))
            if label is not None:
                return label
        frame = frame.f_back
    return OUTSIDE_NAME


class _Saved:
    """What the graph stores for one saved tensor; only the graph references it."""

    __slots__ = ("__weakref__", "t")
    t: torch.Tensor


# The unpack hook, in C: backward pays no Python frame per saved tensor.
_unpack = attrgetter("t")
# Sequence number the next autograd node created in this thread will get.
_next_node_nr = torch._C._autograd._get_sequence_nr


# A storage saved in the call: [owner label, storage bytes, weak refs to the holders saved].
# A list, not a class: one is built per saved storage, on the hot path.
_Held = list


def _alive(held: _Held) -> bool:
    return any(r() is not None for r in held[2:])


def _held_after(held: _Held, died: dict[int, int], last: int) -> bool:
    """Whether a holder was alive at save number ``last`` (``died``: ref id -> saves at death)."""
    return any(r() is not None or died.get(id(r), last) >= last for r in held[2:])


class SavedTensorsCollector(BaseCollector):
    """Collects ``saved_tensors.{unique_bytes,packed_bytes,count,by_module}`` at end.

    Args:
        warn: where a fault in the pack hook is reported (the profiler's warn-once).
    """

    name = "saved_tensors"

    def __init__(self, warn: Callable[[str], None] = no_warn) -> None:
        self.packed_bytes = 0
        self.count = 0
        # Storage (its C object) -> what was saved there and is (maybe) still held, this call.
        self._held: dict[int, _Held] = {}
        # id(weak reference) -> number of saves so far when its holder died (inside the call).
        self._died: dict[int, int] = {}
        self._on_death = self._record_death
        # The autograd node the last new storage was saved for, and its module's label.
        self._last_nr = -1
        self._last_owner = OUTSIDE_NAME
        # Storage (its C object) -> a parameter or buffer on it. Keyed by storage object, not
        # address: FSDP2 frees unsharded parameters after each block (the storage object lives
        # on, resized to 0), and an activation allocated later at the same address is another
        # storage. Holding the tensor keeps its storage object from being reused meanwhile.
        self._excluded: dict[int, torch.Tensor] = {}
        self._excluded_valid = False
        self._labels: dict[int, str] = {}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._entered: torch.autograd.graph.saved_tensors_hooks | None = None
        self._stack: ModuleStack | None = None
        self.faults = HookFaults(warn)
        # (root, its modules, their labels, whether any parameter is sharded), once per root:
        # walking the module tree on every collected call would cost more than the hooks.
        self._tree: tuple[nn.Module, list[nn.Module], dict[int, str], bool] | None = None

    @property
    def failed(self) -> bool:
        """A hook of this collector failed: its figures are incomplete and left out."""
        return PACK_PART in self.faults.off or TRACKER_PART in self.faults.off

    def _tree_of(self, root: nn.Module) -> tuple[nn.Module, list[nn.Module], dict[int, str], bool]:
        if self._tree is None or self._tree[0] is not root:
            mods = list(root.modules())
            sharded = any(callable(getattr(p, "to_local", None)) for p in root.parameters())
            self._tree = (root, mods, module_labels(root), sharded)
            self._excluded_valid = False
        return self._tree

    def _exclude(self, tensors: Any) -> None:
        for t in tensors:
            if t is not None:
                st = _storage(t)
                if st is not None and st.nbytes():
                    self._excluded[st._cdata] = t

    def _on_enter(self, module: nn.Module, label: str, depth: int, args: tuple[Any, ...]) -> None:
        # FSDP2 swaps in unsharded parameters just before forward: exclude them here.
        self._exclude(module._parameters.values())

    def _owner(self, frame: Any) -> str:
        """Label of the module that saves a new storage (a subclass may label modules otherwise)."""
        return _running_module(self._labels, frame)

    def _record_death(self, r: ref[_Saved]) -> None:
        self._died[id(r)] = self.count

    def _pack(self, t: torch.Tensor) -> Any:
        # Runs once per tensor autograd saves, so every attribute read counts. The graph gets a
        # `_Saved` holder that only it references: the weak reference to the holder tells
        # whether the graph still holds what it saved. The holder keeps the tensor itself, as
        # autograd does for an input; an output saved by its own node (its grad_fn is the node
        # being built, the newest in this thread) is detached first, as autograd detaches it:
        # it would otherwise stay alive through a reference cycle with that grad_fn. Storages
        # are keyed by their C object (`_cdata`), which a held tensor keeps from being reused.
        h = _Saved()
        if self._hooks is None:  # switched off after a fault
            h.t = t.detach()
            return h
        try:
            self.count += 1
            if type(t) is not torch.Tensor:
                if isinstance(t, nn.Parameter):
                    h.t = t  # a leaf: resident anyway, and no cycle
                    return h
                return self._pack_subclass(t, h)
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):  # no storage (sparse, nested)
                h.t = t.detach()
                return h
            key = st._cdata
            held = self._held.get(key)
            if held is None and key in self._excluded:
                # A parameter or buffer of the model, or a view of one (weight.t()): resident
                # anyway, and made before the node that saves it (no cycle).
                self.packed_bytes += st.nbytes()
                h.t = t
                return h
            nr = _next_node_nr()
            g = t.grad_fn
            h.t = t.detach() if g is not None and g._sequence_nr() == nr - 1 else t
            if held is not None and (held[2]() is not None or _alive(held)):
                # The same live storage again (a ReLU output the next Linear saves too).
                self.packed_bytes += held[1]
                held.append(ref(h, self._on_death))
                return h
            n = st.nbytes()
            if not n or not st.data_ptr():
                return h  # empty, or on the meta device: no bytes
            self.packed_bytes += n
            base = t._base
            if base is not None and type(base) is not torch.Tensor and isinstance(base, nn.Parameter):
                return h  # a view of a parameter the model does not list (no model given)
            # A new storage (or one saved before that the graph dropped): attribute it to the
            # module running. Saves of one node (one op call: LayerNorm's input, mean and rstd)
            # share one stack walk.
            if nr != self._last_nr:
                self._last_nr, self._last_owner = nr, self._owner(sys._getframe(1))
            self._held[key] = [self._last_owner, n, ref(h, self._on_death)]
            return h
        except Exception as err:
            self._hooks = None  # the context is left at `end`; until then every pack is a no-op
            self.faults.fault(PACK_PART, err, "saved-tensor figures are left out")
            h.t = t.detach()
            return h

    def _pack_subclass(self, t: torch.Tensor, h: _Saved) -> _Saved:
        """The pack hook for tensor subclasses (DTensor shards): storage through ``to_local``."""
        st = _storage(t)
        h.t = t.detach()
        if st is None:
            return h
        key, n = st._cdata, st.nbytes()
        self.packed_bytes += n
        if key in self._excluded:
            return h
        held = self._held.get(key)
        if held is not None and _alive(held):
            held.append(ref(h, self._on_death))
        else:
            nr = _next_node_nr()
            if nr != self._last_nr:
                self._last_nr, self._last_owner = nr, self._owner(sys._getframe(2))
            self._held[key] = [self._last_owner, n, ref(h, self._on_death)]
        return h

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self.packed_bytes = self.count = 0
        self._held = {}
        self._died = {}
        self._last_nr = -1
        if self.failed:
            return {}
        self._labels = {}
        if ctx.module is not None:
            _, mods, labels, sharded = self._tree_of(ctx.module)
            self._labels = labels
            # Built once per window: a stale entry is harmless (a hit counts only while the
            # tensor keeps its storage object), and walking every parameter per call is not.
            if sharded or not self._excluded_valid:
                self._excluded = {}
                for m in mods:
                    self._exclude(m._parameters.values())
                    self._exclude(m._buffers.values())
                self._excluded_valid = not sharded
            # Parameters only change storage mid-forward when they are sharded (DTensor): only
            # then are module hooks needed, to re-exclude each module's unsharded parameters.
            if sharded:
                self._stack = ModuleStack(
                    ctx.module, on_enter=self._on_enter, labels=labels, faults=self.faults, part=TRACKER_PART
                )
                self._stack.install()
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        hooks.__enter__()
        self._hooks = self._entered = hooks
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        if ctx.closes_window or not ok:
            self._excluded_valid = False
        unique, by_module = self._still_held()
        self._release()
        if self.failed:
            return {}
        return {
            "saved_tensors.unique_bytes": unique,
            "saved_tensors.packed_bytes": self.packed_bytes,
            "saved_tensors.count": self.count,
            "saved_tensors.by_module": dict(sorted(by_module.items(), key=itemgetter(1), reverse=True)),
        }

    def _still_held(self) -> tuple[int, dict[str, int]]:
        """Bytes of the storages still held at the call's last save, in total and per module."""
        unique = 0
        by_module: dict[str, int] = {}
        died, last = self._died, self.count
        for held in self._held.values():
            # The first weak reference alive: the common case, the graph the call ends with.
            if held[2]() is not None or _held_after(held, died, last):
                owner, n = held[0], held[1]
                unique += n
                by_module[owner] = by_module.get(owner, 0) + n
        return unique, by_module

    def _release(self) -> None:
        entered, self._entered = self._entered, None
        self._hooks = None
        if entered is not None:
            entered.__exit__(None, None, None)
        if self._stack is not None:
            self._stack.remove()
            self._stack = None
        # Dropping the weak references first means no death callback runs during backward.
        self._held = {}
        self._died = {}
        if not self._excluded_valid:
            self._excluded = {}

    def close(self) -> None:
        self._excluded_valid = False
        self._release()
