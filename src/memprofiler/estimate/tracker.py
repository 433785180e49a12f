"""Per-category live bytes over a fake step, on top of torch's ``MemTracker`` / ``FSDPMemTracker``.

torch's trackers already tag every storage an op creates (parameter, gradient, activation,
temporary, optimizer state and, under FSDP2, sharded / unsharded / all-gather /
reduce-scatter). This module listens to their bookkeeping (``_update_snap``) to keep what
they do not: the raw byte total at every change (for the peak and the module at the peak),
optimizer state apart from the optimizer step's temporaries, and the ordered
allocation log the CUDA allocator model replays. One tracker per estimate: no globals.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import optim
from torch._subclasses.fake_tensor import is_fake
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _UpdateType
from torch.utils.weak import WeakIdKeyDictionary

from memprofiler.estimate import accumulation
from memprofiler.estimate.allocator.caching import AllocatorReplay, MirroredReplay
from memprofiler.estimate.fake import grouped_mm, loss_outputs, queries
from memprofiler.estimate.fake import layouts as fake_layouts
from memprofiler.tracker_hooks import DeadModulesSkipped

#: torch's reference types, by value, to the names an estimate reports.
CATEGORY = {
    _MemRefType.PARAM.value: "parameters",
    _MemRefType.BUFFER.value: "buffers",
    _MemRefType.GRAD.value: "gradients",
    _MemRefType.ACT.value: "activations",
    _MemRefType.TEMP.value: "temporaries",
    _MemRefType.OPT.value: "optimizer_state",
    _MemRefType.OTH.value: "inputs",
    _FSDPRefType.SHARDED_PARAM.value: "parameters",
    _FSDPRefType.UNSHARDED_PARAM.value: "unsharded_parameters",
    _FSDPRefType.SHARDED_GRAD.value: "gradients",
    _FSDPRefType.UNSHARDED_GRAD.value: "unsharded_gradients",
    _FSDPRefType.ALL_GATHER.value: "all_gather_buffers",
    _FSDPRefType.REDUCE_SCATTER.value: "reduce_scatter_buffers",
    _FSDPRefType.OPT.value: "optimizer_state",
    _FSDPRefType.INP.value: "inputs",
}
OPT_TEMP = "optimizer_temporaries"
#: Autocast's copies of the weights in the lower precision, kept in its cast cache from the first
#: use of a weight until the autocast region ends (``cached_cast``: a float32 leaf that requires
#: grad). Not activations: their size is the weights', whatever the batch; FSDP2's
#: ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)`` gathers bf16 weights instead and keeps
#: no such copy.
CAST_CACHE = "autocast_weight_cache"
_TO_COPY = torch.ops.aten._to_copy.default
#: Ops that make a tensor from Python data (``torch.tensor(...)``).
_FROM_PYTHON_DATA = frozenset({torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default})
#: Ops whose CUDA kernel returns its philox seed and offset as CPU scalars outside graph capture
#: (``_efficient_attention_forward``); their fake kernels make them on the run device.
_HOST_RNG_OPS = frozenset({torch.ops.aten._scaled_dot_product_efficient_attention.default})
#: Ops whose fake kernel allocates otherwise than the real CPU and CUDA kernels -> the stand-in the
#: tracker dispatches instead, for fake operands: ``_grouped_mm`` (its fake kernel refuses all but
#: bfloat16) and the output layouts of :data:`fake_layouts.REAL_LAYOUT`.
_STAND_INS: dict[Any, Any] = {
    grouped_mm.OP: grouped_mm.Output(),
    **fake_layouts.REAL_LAYOUT,
    **loss_outputs.REAL_STORAGE,  # the 0-d losses real kernels keep in a storage the input's size
}
#: The ledger key of a storage whose bytes a gradient merged in place took over: its end frees nothing.
_HANDED_OVER = 0


class Ledger:
    """Live bytes per category, the peak with its breakdown, module and phase, and the allocator."""

    def __init__(self, allocator: AllocatorReplay | None = None) -> None:
        self.live: dict[str, int] = {}
        self.total = 0
        self.peak = 0
        self.peak_by_category: dict[str, int] = {}
        self.peak_module = "(none)"
        self.peak_op = ""
        self.peak_phase = "setup"
        self.allocator = allocator if allocator is not None else AllocatorReplay()
        self._keys = itertools.count(1)
        self._no_tensor_keys = itertools.count(-1, -1)
        self._state: set[int] = set()  # keys of storages held in optimizer.state
        self._casts: set[int] = set()  # keys of autocast's cached weight copies
        self.sizes: dict[int, int] = {}  # key -> raw bytes now counted
        self.held = 0  # bytes of workspaces in ``total`` (not tensors)
        self.peak_held = 0
        self.holds: list[tuple[str, int]] = []
        self.merged_in_place = 0  # engine gradient merges counted in place (accumulation.py)

    def no_tensor_key(self) -> int:
        """A fresh allocator key for memory no tensor stands for (buckets, workspaces, scratch).

        Tensor keys count up from 1, these down from -1, so the two never meet.
        """
        return next(self._no_tensor_keys)

    def key_of(self, winfo: Any) -> int:
        key = getattr(winfo, "_memprofiler_key", None)
        if key is None:
            key = next(self._keys)
            winfo._memprofiler_key = key
        return int(key)

    def category(self, winfo: Any, reftype: Any = None) -> str:
        if self._casts and self.key_of(winfo) in self._casts:
            return CAST_CACHE
        name = CATEGORY.get(getattr(reftype or winfo.reftype, "value", ""), "other")
        if name == "optimizer_state" and self.key_of(winfo) not in self._state:
            return OPT_TEMP
        return name

    def move(self, cat: str, delta: int) -> None:
        self.live[cat] = self.live.get(cat, 0) + delta
        self.total += delta

    def mark_cast(self, winfo: Any, nbytes: int) -> None:
        """A weight copy autocast keeps in its cast cache: its own part, not an activation."""
        key = self.key_of(winfo)
        if key in self._casts:
            return
        self.move(self.category(winfo), -nbytes)
        self._casts.add(key)
        self.move(CAST_CACHE, nbytes)

    def mark_state(self, winfo: Any, nbytes: int) -> None:
        """An optimizer-step allocation kept in ``optimizer.state``: state, not a temporary."""
        key = self.key_of(winfo)
        if key not in self._state and self.category(winfo) == OPT_TEMP:
            self.move(OPT_TEMP, -nbytes)
            self._state.add(key)
            self.move("optimizer_state", nbytes)


def _nbytes(winfo: Any) -> int:
    return int(winfo.size * winfo.element_size)


class _NoHook:
    """Stands in for the gradient hooks torch's tracker cannot put on a frozen parameter."""

    def remove(self) -> None:
        return


_NO_HOOKS = (_NoHook(), _NoHook())


class LedgerMixin(DeadModulesSkipped, MemTracker):
    """What an estimate adds to torch's trackers (:class:`SingleTracker`, :class:`FSDPTracker`):
    the ledger kept at every change, the host-side tensors left out, workspaces and kernel scratch
    held or passed through the allocator model, autograd's in-place merges."""

    ledger: Ledger
    phase: str
    #: True while DTensor infers an op's output shape on fake tensors of its own: those
    #: tensors exist on no device, in a real run or here, so they are not counted.
    quiet = False
    #: For a CUDA target: a tensor an optimizer step makes from Python data
    #: (``torch.tensor(0.0)``: a non-capturable, non-fused optimizer's ``step``, and the
    #: constants its foreach kernels take) lives on the host in a real run, not on the GPU.
    host_data_in_opt = False
    #: For a CUDA target: the int64 scalars (philox seed, offset) of :data:`_HOST_RNG_OPS`
    #: live on the host in a real run.
    host_rng = False
    host_rng_count = 0
    _rng_to_host = False
    _host: WeakIdKeyDictionary
    #: The run device's streams seen allocating, the default first (:meth:`_stream`).
    streams: list[Any]
    #: Storages (``_cdata``) of the gradients the autograd engine is routing into input
    #: buffers now (:func:`accumulation.routing_hooks`); empty outside those moments.
    routing: frozenset[int] = frozenset()
    #: The buffer gradient whose storage the merge being dispatched takes over (in place).
    _takeover: Any = None
    #: The op being dispatched: where a peak that no module holds happened (the loss).
    _op: Any = None
    #: The optimizer whose step is running: what it has put in ``optimizer.state`` is state
    #: from that moment (AdamW's moments are made in its first step), not a temporary.
    optimizer: optim.Optimizer | None = None
    #: The autocast dtype while the forward runs under autocast (its state is not visible from
    #: inside a dispatch mode); ``None`` otherwise.
    autocast_dtype: torch.dtype | None = None
    #: A pipeline's step: each stage module runs one forward per micro-batch.
    repeated_forwards = False

    def __enter__(self) -> Any:
        self._quiet_metadata = _quiet_during_metadata_propagation(self)
        self._quiet_metadata.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._quiet_metadata.__exit__(None, None, None)
            raise

    def __exit__(self, *args: Any) -> None:
        try:
            super().__exit__(*args)
        finally:
            self._quiet_metadata.__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is queries.DEVICE:
            found = queries.device_of(args)
            if found is not None:
                return found
        self._op = func
        if func in _STAND_INS and args and is_fake(args[0]):
            func = _STAND_INS[func]
        if self.quiet:
            return func(*args, **(kwargs or {}))
        if self.host_data_in_opt and self._in_opt and func in _FROM_PYTHON_DATA:
            out = func(*args, **(kwargs or {}))
            for st in _storages(out):
                self._host[st] = True
            return out
        if self.host_rng and func in _HOST_RNG_OPS:
            self._rng_to_host = True
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                self._rng_to_host = False
        if (
            func is _TO_COPY
            and self.autocast_dtype is not None
            and _cached_cast(args, kwargs, self.autocast_dtype)
        ):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            for st in _storages(out):
                found = self._WINFO.get(st)
                if found is not None:
                    self.ledger.mark_cast(found[0], _nbytes(found[0]))
            return out
        if func is accumulation.ADD and self.routing:
            old = accumulation.inplace_candidate(self.routing, args, kwargs)
            found = self._WINFO.get(old.untyped_storage()) if old is not None else None
            if found is not None:
                self._takeover = found[0]
                try:
                    return super().__torch_dispatch__(func, types, args, kwargs)
                finally:
                    self._takeover = None
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _track(self, reftype: Any, t: torch.Tensor) -> None:
        if self._rng_to_host and t.dim() == 0 and t.dtype == torch.int64:
            for st in _storages(t):
                self._host[st] = True
            self.host_rng_count += 1
        if self._on_host(t):
            return  # host memory: never on the device
        super()._track(reftype, t)

    def _on_host(self, t: torch.Tensor) -> bool:
        return bool(self._host) and any(st in self._host for st in _storages(t))

    def _update_and_maybe_create_winfos(self, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # torch registers every optimizer.state tensor after a step here, not through _track
        if self._on_host(t):
            return set()
        return super()._update_and_maybe_create_winfos(t, *args, **kwargs)

    def _update_snap(
        self,
        u_type: _UpdateType,
        winfo: Any,
        old_mem_consumed: int | None = None,
        old_reftype: Any = None,
    ) -> None:
        led = self.ledger
        key = led.key_of(winfo)
        n = _nbytes(winfo)
        src = self._takeover
        if key == _HANDED_OVER:
            pass  # its bytes belong to the merged gradient now
        elif u_type == _UpdateType.ADD and src is not None and led.sizes.get(led.key_of(src)) == n:
            # An engine merge torch does in place: the sum keeps the buffer gradient's block.
            self._takeover = None
            winfo._memprofiler_key = key = led.key_of(src)
            src._memprofiler_key = _HANDED_OVER
            led.move(led.category(src), -n)
            led.move(led.category(winfo), n)
            led.merged_in_place += 1
        elif u_type == _UpdateType.ADD:
            led.sizes[key] = n
            led.move(led.category(winfo), n)
            led.allocator.alloc(key, n, self._stream())
        elif u_type == _UpdateType.DEL:
            n = led.sizes.pop(key, n)
            led.move(led.category(winfo), -n)
            led.allocator.free(key)
        elif u_type == _UpdateType.REF:
            n = led.sizes.get(key, n)
            led.move(led.category(winfo, old_reftype), -n)
            led.move(led.category(winfo), n)
        elif u_type == _UpdateType.SIZE:
            # FSDP2 frees and re-allocates unsharded parameters with ``resize_``. torch's
            # old figure is rounded for CUDA tensors; the ledger keeps the raw one.
            led.move(led.category(winfo), n - led.sizes.get(key, 0))
            led.sizes[key] = n
            led.allocator.free(key)
            led.allocator.alloc(key, n, self._stream())
        self._note_peak()
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

    def _stream(self) -> int:
        """The allocator's number (0: the default stream) of the stream allocating now.

        FSDP2 allocates its collectives' buffers under ``device_handle.stream(...)`` of its own
        streams (:mod:`memprofiler.estimate.parallel.fsdp_streams`); on the CPU the steps run on
        that is ``torch.cpu.stream``, so ``torch.cpu.current_stream()`` is the stream a CUDA run
        would allocate on, and the caching allocator keeps its pools per stream.
        """
        now = torch.cpu.current_stream()
        for i, known in enumerate(self.streams):
            if known is now:
                return i
        self.streams.append(now)
        return len(self.streams) - 1

    def _note_peak(self) -> None:
        led = self.ledger
        if led.total > led.peak:
            if self._in_opt and self.optimizer is not None and led.live.get(OPT_TEMP):
                self.mark_optimizer_state(self.optimizer)
            led.peak = led.total
            led.peak_by_category = {k: v for k, v in led.live.items() if v}
            led.peak_held = led.held
            led.peak_module = _deepest(self._mod_tracker.parents)
            led.peak_op = op_name(self._op)
            led.peak_phase = (
                "optimizer" if self._in_opt else "backward" if self._mod_tracker.is_bw else self.phase
            )

    def transient(self, name: str, nbytes: int, what_if: int | None = None) -> None:
        """Scratch a kernel allocates through the caching allocator and frees before returning;
        ``what_if``: the size it might take instead, served in the allocator's what-if twin
        (started at the first such call; ``allocator.MirroredReplay``)."""
        alloc = self.ledger.allocator
        if what_if is not None and isinstance(alloc, MirroredReplay):
            alloc.start_mirror()
            self.phases(name, [[nbytes]], what_if=[[what_if]])
        else:
            self.phases(name, [[nbytes]])

    def phases(self, name: str, phases: list[list[int]], what_if: list[list[int]] | None = None) -> None:
        """Scratch a kernel allocates in phases (each a list of blocks live together), freed on return."""
        led = self.ledger
        if self.quiet:
            return
        cat = f"{name}_scratch"
        alloc = led.allocator
        for i, sizes in enumerate(phases):
            keys = [led.no_tensor_key() for _ in sizes]
            total = sum(sizes)
            led.move(cat, total)
            led.held += total
            for j, (key, n) in enumerate(zip(keys, sizes, strict=True)):
                if what_if is not None and isinstance(alloc, MirroredReplay):
                    alloc.alloc_as(key, n, what_if[i][j])
                else:
                    alloc.alloc(key, n)
            self._note_peak()
            for key in keys:
                alloc.free(key)
            led.held -= total
            led.move(cat, -total)

    def hold(self, name: str, nbytes: int) -> None:
        """Memory a library allocates through the caching allocator and keeps (a workspace)."""
        led = self.ledger
        cat = name.split(" ", 1)[0] + "_workspaces"
        led.move(cat, nbytes)
        led.held += nbytes
        led.allocator.alloc(led.no_tensor_key(), nbytes)
        led.holds.append((name, nbytes))
        self._note_peak()

    def _track_module_params_and_buffers(
        self, module: torch.nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        # torch's MemTracker hooks every parameter's gradient and raises on a frozen one
        # (``requires_grad=False``), which has no gradient to count: mark it hooked.
        hooks = self._param_to_grad_hook_handles
        for p in module.parameters():
            if not p.requires_grad and hooks.get(p, None) is None:
                hooks[p] = _NO_HOOKS
        counted: tuple[int, int] = super()._track_module_params_and_buffers(module, install_grad_hooks)
        return counted

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        # torch's tracker refuses a root module's second forward in one iteration; a pipeline
        # stage runs one per micro-batch. Its per-module stats start afresh (the ledger keeps none).
        if self.repeated_forwards and module in self.memory_tracking and not self._mod_tracker.is_bw:
            del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)

    def _update_peak_stats(self, peak_state: Any) -> None:
        # The ledger keeps the peak; torch's per-module peaks deep-copy a snapshot for
        # every active module on every op, which dominated the cost of an estimate.
        return

    def mark_optimizer_state(self, optimizer: optim.Optimizer) -> None:
        for states in optimizer.state.values():
            for val in states.values():
                if isinstance(val, torch.Tensor):
                    for st in _storages(val):
                        found = self._WINFO.get(st)
                        if found is not None:
                            self.ledger.mark_state(found[0], _nbytes(found[0]))


@contextlib.contextmanager
def _quiet_during_metadata_propagation(tracker: Any) -> Iterator[None]:
    """While the block runs, ``tracker`` counts nothing DTensor's sharding propagator makes.

    To learn an op's output shape DTensor runs the op on fake tensors of the global shape
    (``ShardingPropagator._propagate_tensor_meta_non_cached``), inside our fake mode, so the
    tracker saw them as optimizer temporaries. Its cache hides this only where it hits, and
    torch 2.11 keys Adam's per-step ``addcdiv_`` value: on the GPU node's torch each new step
    missed, and the first FSDP estimate in a process peaked in the optimizer (22,528 B instead
    of 21,504 B for test_device_choice's net), the next one not.
    """
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:  # a torch without DTensor: nothing to quiet
        yield
        return
    name = "_propagate_tensor_meta_non_cached"
    infer = ShardingPropagator.__dict__.get(name)
    if infer is None:  # a torch that infers elsewhere: counted as before
        yield
        return

    def quiet_infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        was, tracker.quiet = tracker.quiet, True
        try:
            return infer(self, *args, **kwargs)
        finally:
            tracker.quiet = was

    setattr(ShardingPropagator, name, quiet_infer)
    try:
        yield
    finally:
        setattr(ShardingPropagator, name, infer)


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        t = to_local()
    return [t.untyped_storage()]


def _cached_cast(args: Any, kwargs: Any, dtype: torch.dtype) -> bool:
    """Whether autocast keeps this ``_to_copy`` in its cast cache (torch's ``cached_cast``): a
    float32 leaf that requires grad, cast to the autocast dtype (the cache is on by default)."""
    arg = args[0] if args else None
    if not isinstance(arg, torch.Tensor) or arg.dtype != torch.float32:
        return False
    if not (arg.requires_grad and arg.is_leaf and arg._base is None):
        return False
    return bool((kwargs or {}).get("dtype") == dtype and torch.is_autocast_cache_enabled())


def op_name(func: Any) -> str:
    """``aten.mm`` for ``aten.mm.default``: the op's name without its overload; ``""`` for none."""
    if func is None:
        return ""
    return str(getattr(func, "_overloadpacket", func))


def _deepest(parents: Iterable[str]) -> str:
    names = [p for p in parents if p != "Global"]
    if not names:
        return "(outside forward)"
    # The deepest; among siblings active at once (two stages both in backward), the last by name,
    # so every process names the same module (a set's order follows the hash seed).
    best = max(names, key=lambda n: (n.count("."), len(n), n))
    # ModTracker names modules ``Root.layer.0``; drop the root's class name as module_labels do.
    return best.split(".", 1)[1] if "." in best else "(root)"


def _fsdp_root(module: torch.nn.Module) -> torch.nn.Module:
    """The outermost ``fully_shard``-ed module (a LightningModule wraps it and is not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            return m
    return module


class SingleTracker(LedgerMixin, MemTracker):
    """torch's ``MemTracker`` with the estimate's ledger: a model that is not sharded."""


class FSDPTracker(LedgerMixin, FSDPMemTracker):
    """torch's ``FSDPMemTracker`` with the estimate's ledger: an FSDP2-sharded model."""


def new_tracker(
    fsdp: bool, module: torch.nn.Module, optimizer: optim.Optimizer, allocator: AllocatorReplay | None = None
) -> Any:
    """A tracker with a fresh :class:`Ledger`, for an FSDP2-sharded module or a plain one."""
    tracker = FSDPTracker(_fsdp_root(module), optimizer) if fsdp else SingleTracker()
    tracker.ledger = Ledger(allocator)
    tracker._host = WeakIdKeyDictionary()
    tracker.streams = [torch.cpu.current_stream()]
    tracker.phase = "forward"
    if not fsdp:
        tracker.track_external(module, optimizer)
    return tracker
