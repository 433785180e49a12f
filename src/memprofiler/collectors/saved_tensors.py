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
holder that only the graph references, so the holder dies with the graph and its death,
while the call is open, records when (how many saves had happened). The holder keeps the saved tensor itself, as
autograd does for an input, except for an output saved by its own node (its ``grad_fn`` is
the newest node of the thread): that one is detached, as autograd detaches it, since it would
otherwise stay alive through a reference cycle with its ``grad_fn``. Storages are keyed by
their C storage object, which a live holder keeps from being reused within the call. At the
end of the call the counting stops, so nothing of ours but freeing the holders runs when
backward frees the graph.

Attribution needs no module hooks: the pack hook walks the Python frames above it to the
innermost ``nn.Module.__call__`` of a module of the profiled model, once per new storage.
Every module, of this model or any other, keeps ``nn.Module``'s hook-free fast path.

The pack hook is ``memprofiler._packer.Packer`` where the install could compile it
(setup.py), else its Python twin :class:`_PyPacker`, with the same figures. The compiled one
reads each plain tensor's storage, node numbers and view flag from the C++ tensor where
``memprofiler._tensor_facts`` was built against this torch, and through Python otherwise. The Python one
learns of a holder's death through a weak reference with a callback; the C one counts live
holders per storage in the holders themselves, pays no interpreter frame per saved tensor, and
makes nothing per saved tensor that the cyclic garbage collector tracks.

Cost inside the window (CPU, 1 thread, same FLOPs): see docs/performance.md and
``benchmarks/results/scaling_cpu_20261123.json``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from operator import attrgetter, itemgetter
from typing import Any
from weakref import ref

import torch
from torch import nn

from memprofiler import metrics
from memprofiler.collectors.base import BaseCollector, CallContext, Warn
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


class _PyPacker:
    """The pack hook and what it counts in one collected call.

    ``memprofiler._packer.Packer`` is its C twin (built by setup.py where a compiler is
    found): same arguments, attributes and results, without an interpreter frame per save and
    without a weak reference per holder.

    Args:
        storage_of: the storage of a tensor subclass (DTensor: through ``to_local``), or None.
        on_fault: called with the exception when packing fails; the packer then switches off.
        next_nr: the sequence number the next autograd node of this thread will get.
        tensor_type, param_type, call_code, outside: ``torch.Tensor``, ``nn.Parameter``, the
            code of ``Module.__call__`` and the label of a save made outside any module.
    """

    __slots__ = (
        "_died",
        "_on_death",
        "call_code",
        "count",
        "enabled",
        "excluded",
        "held",
        "labels",
        "last_nr",
        "last_owner",
        "next_nr",
        "on_fault",
        "outside",
        "owner",
        "packed_bytes",
        "param_type",
        "storage_of",
        "tensor_type",
    )

    def __init__(
        self,
        storage_of: Callable[[torch.Tensor], torch.UntypedStorage | None],
        on_fault: Callable[[BaseException], None],
        next_nr: Callable[[], int],
        tensor_type: type,
        param_type: type,
        call_code: Any,
        outside: str,
    ) -> None:
        self.storage_of, self.on_fault, self.next_nr = storage_of, on_fault, next_nr
        self.tensor_type, self.param_type, self.call_code, self.outside = (
            tensor_type,
            param_type,
            call_code,
            outside,
        )
        # Storage (its C object) -> [owner label, storage bytes, weak refs to the holders saved].
        self.held: dict[int, _Held] = {}
        # Storage (its C object) -> a parameter or buffer on it (see the collector).
        self.excluded: dict[int, torch.Tensor] = {}
        self.labels: dict[int, str] = {}
        # None, or a function(frame) -> label that replaces the stack walk (subclasses).
        self.owner: Callable[[Any], str] | None = None
        self.count = self.packed_bytes = 0
        # The autograd node the last new storage was saved for, and its module's label.
        self.last_nr, self.last_owner = -1, outside
        self.enabled = True
        # id(weak reference) -> number of saves so far when its holder died (inside the call).
        self._died: dict[int, int] = {}
        self._on_death = self._record_death

    def _record_death(self, r: ref[_Saved]) -> None:
        self._died[id(r)] = self.count

    def pack(self, t: torch.Tensor) -> Any:
        # Runs once per tensor autograd saves, so every attribute read counts. The graph gets a
        # `_Saved` holder that only it references: the weak reference to the holder tells
        # whether the graph still holds what it saved. The holder keeps the tensor itself, as
        # autograd does for an input; an output saved by its own node (its grad_fn is the node
        # being built, the newest in this thread) is detached first, as autograd detaches it:
        # it would otherwise stay alive through a reference cycle with that grad_fn. Storages
        # are keyed by their C object (`_cdata`), which a held tensor keeps from being reused.
        h = _Saved()
        if not self.enabled:  # switched off after a fault, or the call is over
            h.t = t.detach()
            return h
        try:
            self.count += 1
            if type(t) is not self.tensor_type:
                if isinstance(t, self.param_type):
                    h.t = t  # a leaf: resident anyway, and no cycle
                    return h
                return self._pack_subclass(t, h)
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):  # no storage (sparse, nested)
                h.t = t.detach()
                return h
            key = st._cdata
            held = self.held.get(key)
            if held is None and key in self.excluded:
                # A parameter or buffer of the model, or a view of one (weight.t()): resident
                # anyway, and made before the node that saves it (no cycle).
                self.packed_bytes += st.nbytes()
                h.t = t
                return h
            nr = self.next_nr()
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
            if base is not None and type(base) is not self.tensor_type and isinstance(base, self.param_type):
                return h  # a view of a parameter the model does not list (no model given)
            # A new storage (or one saved before that the graph dropped): attribute it to the
            # module running. Saves of one node (one op call: LayerNorm's input, mean and rstd)
            # share one stack walk.
            if nr != self.last_nr:
                self.last_nr, self.last_owner = nr, self._owner(sys._getframe(1))
            self.held[key] = [self.last_owner, n, ref(h, self._on_death)]
            return h
        except Exception as err:
            self.enabled = False  # until the call ends, every pack is a no-op
            self.on_fault(err)
            h.t = t.detach()
            return h

    def _pack_subclass(self, t: torch.Tensor, h: _Saved) -> _Saved:
        """A tensor subclass (DTensor shards): its storage through ``storage_of``."""
        h.t = t.detach()
        st = self.storage_of(t)
        if st is None:
            return h
        key, n = st._cdata, st.nbytes()
        self.packed_bytes += n
        if key in self.excluded:
            return h
        held = self.held.get(key)
        if held is not None and _alive(held):
            held.append(ref(h, self._on_death))
        else:
            nr = self.next_nr()
            if nr != self.last_nr:
                self.last_nr, self.last_owner = nr, self._owner(sys._getframe(2))
            self.held[key] = [self.last_owner, n, ref(h, self._on_death)]
        return h

    def _owner(self, frame: Any) -> str:
        owner = self.owner
        return _running_module(self.labels, frame) if owner is None else owner(frame)

    def still_held(self) -> tuple[int, dict[str, int]]:
        """Bytes of the storages still held at the call's last save, in total and per module."""
        unique = 0
        by_module: dict[str, int] = {}
        died, last = self._died, self.count
        for held in self.held.values():
            # The first weak reference alive: the common case, the graph the call ends with.
            if held[2]() is not None or _held_after(held, died, last):
                owner, n = held[0], held[1]
                unique += n
                by_module[owner] = by_module.get(owner, 0) + n
        return unique, by_module


# The compiled packer where setup.py could build it; the Python one otherwise.
_CPacker: type[Any] | None
try:
    from memprofiler._packer import Packer as _CPacker
except ImportError:  # pragma: no cover - built wherever a C compiler is found
    _CPacker = None


def _use_tensor_facts() -> str:
    """Hand the compiled hook the C++ tensor facts (``_tensor_facts``); why not, where it cannot."""
    if _CPacker is None:
        return "no compiled pack hook"
    try:
        from memprofiler._tensor_facts import API, TORCH_VERSION
    except ImportError as err:  # not built (no torch while building), or for another torch
        return f"memprofiler._tensor_facts does not load ({err})"
    if torch.__version__ != TORCH_VERSION:
        return f"memprofiler._tensor_facts was built for torch {TORCH_VERSION}"
    sys.modules[_CPacker.__module__].use_facts(API)
    return ""


#: Why the compiled hook reads tensors through Python ("" where it reads them in C++).
NO_TENSOR_FACTS = _use_tensor_facts()


def read_tensors_in_cpp(on: bool) -> None:
    """Switch the compiled hook's C++ tensor reads on (where they load) or off (through Python),
    for every packer: to compare the two routes (tests, benchmarks)."""
    if _CPacker is None:
        return
    sys.modules[_CPacker.__module__].use_facts(None)
    if on:
        _use_tensor_facts()


def _stale(module: str, *sources: str) -> bool:
    """Whether the extension ``module`` (loaded) was built from other sources than those beside
    the package (a source checkout; an installed package has none and is never stale)."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).parents[1]
    if not all((here / name).is_file() for name in sources):
        return False
    h = hashlib.sha256()
    for name in sources:
        h.update((here / name).read_bytes())
    return getattr(sys.modules[module], "SOURCE_SHA256", "") != h.hexdigest()


def packer_build() -> str:
    """Which pack hook runs: ``compiled`` (reading each tensor from C++); ``compiled, tensors
    through python`` where ``_tensor_facts`` was not built or not for this torch
    (:data:`NO_TENSOR_FACTS` says why), or its reads are off (:func:`read_tensors_in_cpp`);
    ``compiled, stale`` where the sources beside the package (a source checkout) are not the ones
    it was built from; ``python`` where none was built.

    A stale build still counts the same figures as its source did, but it is not the code being
    read or changed, and timing it says nothing about that code: rebuild it with ``make install``
    (or ``python setup.py build_ext --inplace``).
    """
    if _CPacker is None:
        return "python"
    in_cpp = sys.modules[_CPacker.__module__].facts_in_use()  # as the hook reads now
    stale = _stale(_CPacker.__module__, "_packer.c", "_tensor_facts.h")
    if in_cpp:
        stale = stale or _stale("memprofiler._tensor_facts", "_tensor_facts.cpp", "_tensor_facts.h")
    if stale:
        return "compiled, stale"
    return "compiled" if in_cpp else "compiled, tensors through python"


class SavedTensorsCollector(BaseCollector):
    """Collects ``saved_tensors.{unique_bytes,packed_bytes,count,by_module}`` at end.

    Args:
        warn: where a fault in the pack hook is reported (the profiler's warn-once).
        compiled: use the compiled pack hook (``memprofiler._packer``) where it was built; the
            Python one counts the same, slower.
    """

    name = "saved_tensors"

    def __init__(self, warn: Warn = no_warn, compiled: bool = True) -> None:
        self._compiled = compiled
        # Storage (its C object) -> a parameter or buffer on it. Keyed by storage object, not
        # address: FSDP2 frees unsharded parameters after each block (the storage object lives
        # on, resized to 0), and an activation allocated later at the same address is another
        # storage. Holding the tensor keeps its storage object from being reused meanwhile.
        self._excluded: dict[int, torch.Tensor] = {}
        self._excluded_valid = False
        # The pack hook and its counts for the call (a new one per call).
        self._p: _PyPacker = self._new_packer()
        self._p.enabled = False
        self._entered: torch.autograd.graph.saved_tensors_hooks | None = None
        self._stack: ModuleStack | None = None
        self.faults = HookFaults(warn)
        # (root, its modules, their labels, whether any parameter is sharded), once per root:
        # walking the module tree on every collected call would cost more than the hooks.
        self._tree: tuple[nn.Module, list[nn.Module], dict[int, str], bool] | None = None

    @property
    def count(self) -> int:
        """Tensors saved so far in this call."""
        return int(self._p.count)

    @property
    def packed_bytes(self) -> int:
        """Storage bytes of every non-parameter save so far in this call (the ancestor's npp)."""
        return int(self._p.packed_bytes)

    def _new_packer(self) -> _PyPacker:
        cls: Any = _CPacker if self._compiled and _CPacker is not None else _PyPacker
        p: _PyPacker = cls(
            _storage, self._on_fault, _next_node_nr, torch.Tensor, nn.Parameter, _CALL, OUTSIDE_NAME
        )
        if type(self)._owner is not SavedTensorsCollector._owner:
            p.owner = self._owner
        return p

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
        """Label of the module that saves a new storage; a subclass may label modules otherwise.

        Not called unless overridden: the packer walks the stack itself.
        """
        return _running_module(self._p.labels, frame)

    def _on_fault(self, err: BaseException) -> None:
        self.faults.fault(PACK_PART, err, "saved-tensor figures are left out")

    def _pack(self, t: torch.Tensor) -> Any:
        """The pack hook (a subclass may wrap it; otherwise the packer's is installed directly)."""
        return self._p.pack(t)

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self._p = p = self._new_packer()
        if self.failed:
            p.enabled = False
            return {}
        if ctx.module is not None:
            _, mods, labels, sharded = self._tree_of(ctx.module)
            p.labels = labels
            # Built once per window: a stale entry is harmless (a hit counts only while the
            # tensor keeps its storage object), and walking every parameter per call is not.
            if sharded or not self._excluded_valid:
                self._excluded = {}
                for m in mods:
                    self._exclude(m._parameters.values())
                    self._exclude(m._buffers.values())
                self._excluded_valid = not sharded
            p.excluded = self._excluded
            # Parameters only change storage mid-forward when they are sharded (DTensor): only
            # then are module hooks needed, to re-exclude each module's unsharded parameters.
            if sharded:
                self._stack = ModuleStack(
                    ctx.module, on_enter=self._on_enter, labels=labels, faults=self.faults, part=TRACKER_PART
                )
                self._stack.install()
        pack = p.pack if type(self)._pack is SavedTensorsCollector._pack else self._pack
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, _unpack)
        hooks.__enter__()
        self._entered = hooks
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        if ctx.closes_window or not ok:
            self._excluded_valid = False
        try:
            if self.failed:  # the hook's state may be what failed: not read
                return {}
            unique, by_module = self._p.still_held()
        finally:
            self._release()
        return {
            metrics.SAVED_UNIQUE: unique,
            metrics.SAVED_PACKED: self.packed_bytes,
            metrics.SAVED_COUNT: self.count,
            metrics.SAVED_BY_MODULE: dict(sorted(by_module.items(), key=itemgetter(1), reverse=True)),
        }

    def _release(self) -> None:
        entered, self._entered = self._entered, None
        p = self._p
        p.enabled = False
        if entered is not None:
            entered.__exit__(None, None, None)
        if self._stack is not None:
            self._stack.remove()
            self._stack = None
        # Dropping what the call counted: no death is recorded during backward, and a graph
        # kept past the call keeps no label or parameter alive through its holders.
        p.held = {}
        p.excluded = {}
        p.labels = {}
        if not self._excluded_valid:
            self._excluded = {}

    def close(self) -> None:
        self._excluded_valid = False
        self._release()
