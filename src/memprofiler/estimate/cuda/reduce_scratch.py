"""The global scratch torch's generic CUDA reduction allocates inside the kernel launch.

Sum, mean, prod, amax/amin, max/min along a dim, argmax/argmin, vector norms, var/std and
any/all run on CUDA through one kernel template, ``gpu_reduce_kernel``
(``aten/src/ATen/native/cuda/Reduce.cuh``). Its launch configuration (``setReduceConfig``) maps
the block's x threads to the input's fastest-moving dimension and, when each output has many
inputs and there are few outputs, splits every output's inputs across several blocks
(``ctas_per_output``). Those blocks meet through global memory: the launch takes a staging
buffer (one accumulator per output, block and, when x threads hold different outputs, per x
lane and output vector) and a semaphore per block column through the caching allocator, and
frees both when the op returns. A column reduction, reducing dim 0 of a row-major ``[N, C]``
tensor as every Linear's bias gradient does, takes ``4 x C x ctas x 32 x 4`` bytes: 9.83 MB
for ViT-S's ``[3152, 384]`` float32 gradient on an H200, up to ~148 MB for wide ones.

This module replays torch 2.11's rules on tensor metadata (shape, strides, storage offset,
dtype), with no data and no device:

- the reduction's ``TensorIterator``: reduced dims to the front, then dims sorted by stride
  (output first, then input; equal strides broken by size), adjacent dims merged where their
  strides allow (``reorder_dimensions``, ``coalesce_dimensions``), which gives the fastest
  dimension, the number of outputs and the inputs per output;
- ``setReduceConfig``: vectorising the input (contiguous row reductions) or the outputs (four
  at a time where the input's address, the output extent and the reduced strides allow), block
  width and height, splitting across warps, then across blocks sized to fill the device
  (SM count x resident threads per SM / threads per block);
- ``ReduceConfig``'s ``global_memory_size`` and ``semaphore_size``;
- the accumulator type each kernel reduces in (``arg_t``: float for half/bfloat16/float sums,
  means and norms; the input's own type for amax/amin and any/all; a (value, int64 index) pair for
  max/min along a dim and argmax/argmin; Welford's (mean, m2, n, nf) for var/std), and how many
  elements a thread loads at once from a vectorised input (8 for 16-bit sums and means, 2 for
  var/std, 4 otherwise; recent torch also widens float sums whose reduced size divides by 1024,
  not modelled: over 170,000 row-reduction shapes tried, the width never changes the global
  scratch, since a launch narrow enough for it to matter has too few values per thread to be
  split across blocks);
- an iterator too large for 32-bit offsets is halved along its widest dim until each piece fits
  (``with_32bit_indexing``), each piece a launch of its own; where the output cannot accumulate
  partial results in its own type (half or bfloat16 in and out, pairs, Welford) an accumulation
  buffer (one accumulator per output element) lives across the pieces;
- an input whose dtype the kernel does not take (an integer or bool tensor summed as int64) is
  first copied to that dtype.

Measured on an H200 with torch 2.11 (``tests/fixtures/gpu_h200/reductions_h200.json``, 1,820
reductions of float32 and bfloat16 tensors): the requests, each rounded to 512 B, are the
measured scratch in 1,809 rows; in the other 11 the allocator served the staging buffer from a
cached block up to 1 MiB larger, left whole (a rest of 1 MiB or less is not split off). Replayed
through the allocator model, 1,811 rows match to the byte; the 9 left depend on the probe's
earlier allocations, which the replay does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

_aten = torch.ops.aten
#: Threads per block (``mnt_wrapper``): 512, 256 for complex128 inputs.
MAX_THREADS = 512
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
INT32_MAX = 2**31 - 1
LOWP = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Device:
    """The device properties ``setReduceConfig`` reads."""

    sms: int
    threads_per_sm: int
    warp: int = 32


@dataclass
class Iter:
    """A reduction's ``TensorIterator`` after reordering and coalescing: dim 0 moves fastest,
    reduced dims (output stride 0) come first. Strides are in bytes."""

    shape: list[int]
    out_strides: list[int]
    in_strides: list[int]
    in_offset: int
    """The input's storage offset in elements (the allocator's blocks are 512-byte aligned)."""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def num_reduce_dims(self) -> int:
        return sum(1 for s in self.out_strides if s == 0)

    @property
    def num_outputs(self) -> int:
        n = 1
        for size, stride in zip(self.shape, self.out_strides, strict=True):
            if stride != 0 or size == 0:
                n *= size
        return n


@dataclass(frozen=True)
class Kernel:
    """One instantiation of ``gpu_reduce_kernel``: element sizes and input vector width."""

    in_size: int
    """``sizeof(scalar_t)``: the input the kernel reads."""
    arg_size: int
    """``sizeof(arg_t)``: the accumulator the staging buffer holds."""
    out_size: int
    input_vec: int = 4
    """``input_vec_size``: elements one thread loads at once when the input is vectorised (``vt0``
    unless the kernel says otherwise)."""
    accumulates_in_output: bool = True
    """Whether partial results of 32-bit pieces can be combined in the output's own type."""
    max_threads: int = MAX_THREADS


def _contiguous(shape: Sequence[int]) -> list[int]:
    strides, n = [], 1
    for s in reversed(shape):
        strides.append(n)
        n *= max(int(s), 1)
    return strides[::-1]


def build_iter(
    shape: Sequence[int],
    strides: Sequence[int],
    offset: int,
    reduced: Sequence[int],
    in_size: int,
    out_size: int,
) -> Iter:
    """The iterator ``TensorIterator::reduce_op`` builds for reducing dims ``reduced`` of an input
    (``shape``, element ``strides``), the output a fresh contiguous tensor of the kept dims."""
    ndim = len(shape)
    red = set(reduced)
    kept = [int(shape[d]) for d in range(ndim) if d not in red]
    kept_strides = iter(_contiguous(kept))
    out = [0 if d in red else next(kept_strides) * out_size for d in range(ndim)]
    sizes = [int(s) for s in shape]
    ins = [int(s) * in_size for s in strides]
    if ndim <= 1:
        return Iter(sizes, out, ins, offset)
    perm = list(range(ndim - 1, -1, -1))

    def should_swap(d0: int, d1: int) -> int:
        for is_out, st in ((True, out), (False, ins)):
            s0, s1 = st[d0], st[d1]
            if is_out and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if sizes[d0] > sizes[d1]:
                return 1
        return 0

    for i in range(1, ndim):  # insertion sort that tolerates ambiguous comparisons
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    it = Iter([sizes[p] for p in perm], [out[p] for p in perm], [ins[p] for p in perm], offset)
    _coalesce(it)
    return it


def _coalesce(it: Iter) -> None:
    """Merge adjacent dims where a size is 1 or every operand steps evenly across both."""
    if it.ndim <= 1:
        return
    shape, ops = it.shape, (it.out_strides, it.in_strides)
    prev = 0
    for dim in range(1, len(shape)):
        s0, s1 = shape[prev], shape[dim]
        merge = s0 == 1 or s1 == 1 or all(s0 * st[prev] == st[dim] for st in ops)
        if merge:
            if s0 == 1:
                for st in ops:
                    st[prev] = st[dim]
            shape[prev] *= s1
        else:
            prev += 1
            if prev != dim:
                for st in ops:
                    st[prev] = st[dim]
                shape[prev] = shape[dim]
    del shape[prev + 1 :]
    for st in ops:
        del st[prev + 1 :]


def _last_pow2(n: int) -> int:
    """The largest power of two not above ``n`` (at least 1)."""
    return 1 << (n.bit_length() - 1) if n > 1 else 1


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _output_vec_size(it: Iter, in_size: int) -> int:
    """``get_output_vec_size``: 4, halved until the input's address, the first kept dim's size and
    every other input stride (in elements) divide by it."""
    vec = 4
    out_dim = it.num_reduce_dims
    values = [it.in_offset, it.shape[out_dim]]
    values += [s // in_size for j, s in enumerate(it.in_strides) if j != out_dim]
    for v in values:
        while v % vec:
            vec //= 2
    return vec


@dataclass
class Config:
    """The parts of ``ReduceConfig`` that decide the global scratch."""

    arg_size: int
    num_outputs: int
    num_inputs: int
    block_width: int = 1
    block_height: int = 1
    step_input: int = 1
    step_output: int = 1
    ctas_per_output: int = 1
    output_vec_size: int = 1
    block_x_reduce: bool = False
    global_reduce: bool = False

    @property
    def grid_x(self) -> int:
        return _div_up(self.num_outputs // self.output_vec_size, self.step_output)

    def values_per_thread(self) -> int:
        return _div_up(self.num_inputs, self.step_input)

    def global_memory_size(self) -> int:
        if not self.global_reduce:
            return 0
        size = self.arg_size * self.num_outputs * self.ctas_per_output
        if not self.block_x_reduce:
            size *= self.block_width * self.output_vec_size
        return size

    def semaphore_size(self) -> int:
        return 4 * self.grid_x if self.global_reduce else 0


def reduce_config(it: Iter, kernel: Kernel, device: Device) -> Config:
    """``setReduceConfig`` for one (32-bit indexable) iterator."""
    num_outputs = it.num_outputs
    inputs_per_output = it.numel // num_outputs
    cfg = Config(kernel.arg_size, num_outputs, inputs_per_output)
    nred = it.num_reduce_dims
    if it.ndim > 0:
        on_fastest = nred == it.ndim or it.in_strides[0] < it.in_strides[nred]
        if on_fastest:
            dim0, dim1, fastest = inputs_per_output, num_outputs, it.in_strides[0]
        else:
            dim0, dim1, fastest = num_outputs, inputs_per_output, it.in_strides[nred]
    else:
        on_fastest, fastest, dim0, dim1 = True, kernel.in_size, 1, 1
    if fastest == kernel.in_size:
        if on_fastest and dim0 >= 128 and nred == 1:
            dim0 //= kernel.input_vec
        elif not on_fastest:
            cfg.output_vec_size = _output_vec_size(it, kernel.in_size)
            dim0 //= cfg.output_vec_size
    # set_block_dimension
    max_threads = kernel.max_threads // cfg.output_vec_size
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(dim0_pow2, device.warp)
    height = min(dim1_pow2, max_threads // width)
    width = min(dim0_pow2, max_threads // height)
    cfg.block_width, cfg.block_height = width, height
    num_threads = width * height
    if it.ndim == 0 or on_fastest:
        cfg.block_x_reduce = True
        cfg.step_input *= width
    else:
        cfg.step_output *= width
    split_warps = cfg.values_per_thread() >= min(height * 16, MAX_VALUES_PER_THREAD)
    if split_warps:
        cfg.step_input *= height
    else:
        cfg.step_output *= height
    target_grid = device.sms * (device.threads_per_sm // num_threads)
    grid = cfg.grid_x
    if split_warps and cfg.values_per_thread() >= MAX_VALUES_PER_THREAD and grid <= target_grid:
        vpt = cfg.values_per_thread()
        ctas = max(
            min(_div_up(target_grid, grid), _div_up(vpt, MIN_VALUES_PER_THREAD)),
            _div_up(vpt, MAX_VALUES_PER_THREAD),
        )
        cfg.ctas_per_output = ctas
        if ctas > 1:
            cfg.global_reduce = True
            cfg.step_input *= ctas
    return cfg


def _fits_32bit(it: Iter) -> bool:
    if it.numel > INT32_MAX:
        return False
    for st in (it.out_strides, it.in_strides):
        if 1 + sum((s - 1) * abs(d) for s, d in zip(it.shape, st, strict=True)) > INT32_MAX:
            return False
    return True


def _halves(it: Iter, in_size: int) -> list[Iter]:
    """``TensorIterator::split`` on the dim with the widest byte extent (the last such from the end)."""
    best, dim = -1, -1
    for d in range(it.ndim - 1, -1, -1):
        if it.shape[d] == 0:
            continue
        for st in (it.out_strides, it.in_strides):
            extent = (it.shape[d] - 1) * abs(st[d])
            if extent > best:
                best, dim = extent, d
    first = it.shape[dim] // 2
    a = Iter(list(it.shape), list(it.out_strides), list(it.in_strides), it.in_offset)
    a.shape[dim] = first
    b = Iter(list(it.shape), list(it.out_strides), list(it.in_strides), it.in_offset)
    b.shape[dim] = it.shape[dim] - first
    b.in_offset += first * it.in_strides[dim] // in_size
    return [a, b]


def launch_scratch(it: Iter, kernel: Kernel, device: Device) -> list[int]:
    """Staging buffer and semaphores (raw bytes, zeros left out) of the largest launch ``it`` takes."""
    if it.numel == 0:
        return []
    best: list[int] = []
    seen: set[tuple[tuple[int, ...], int]] = set()
    todo = [it]
    while todo:
        cur = todo.pop()
        key = (tuple(cur.shape), cur.in_offset % 4)
        if key in seen:
            continue
        seen.add(key)
        if not _fits_32bit(cur):
            todo += _halves(cur, kernel.in_size)
            continue
        cfg = reduce_config(cur, kernel, device)
        sizes = [n for n in (cfg.global_memory_size(), cfg.semaphore_size()) if n]
        if sum(sizes) > sum(best):
            best = sizes
    if not _fits_32bit(it) and not kernel.accumulates_in_output and kernel.out_size < kernel.arg_size:
        best = [it.num_outputs * kernel.arg_size, *best]  # AccumulationBuffer, across the pieces
    return best


# ---- the ops --------------------------------------------------------------------------------------


def _size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _acc(dtype: torch.dtype) -> torch.dtype:
    """``opmath``/``acc_type`` on CUDA: float for half, bfloat16 and float."""
    return torch.float32 if dtype in LOWP else dtype


def _dims(dim: Any, ndim: int) -> list[int]:
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    dims = [d % max(ndim, 1) for d in dim]
    return dims if dims else list(range(ndim))


def _sum_like_dtypes(x: torch.Tensor, dtype: Any, promote_int: bool) -> tuple[torch.dtype, torch.dtype]:
    """(dtype the kernel reads, output dtype) of sum/prod/mean/nansum (``make_reduction_from_out_ty``)."""
    out = dtype or x.dtype
    if dtype is None and promote_int and not (x.dtype.is_floating_point or x.dtype.is_complex):
        out = torch.int64
    lowp_to_f32 = x.dtype in LOWP and out == torch.float32
    return (x.dtype if lowp_to_f32 else out), out


@dataclass(frozen=True)
class Call:
    """A reduction call as the kernel sees it."""

    kernel: Kernel
    dims: list[int]
    in_dtype: torch.dtype


def describe_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call | None:
    """The kernel and reduced dims of an aten reduction call, or None for an op this does not model."""
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.numel() == 0:
        return None
    if getattr(x, "to_local", None) is not None:
        return None  # a DTensor: its global shape runs no kernel; its local op comes back on its own
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
    ndim = x.dim()
    rest = list(args[1:])

    def arg(i: int, key: str, default: Any = None) -> Any:
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    if name in ("sum", "nansum", "prod", "mean"):
        full = func in (_aten.sum.default, _aten.prod.default, _aten.mean.default)
        dims = _dims(None if full else arg(0, "dim"), ndim)
        dtype = kwargs.get("dtype") if full else arg(2, "dtype")
        if name == "mean" and not (x.dtype.is_floating_point or dtype is not None):
            return None
        in_dt, out_dt = _sum_like_dtypes(x, dtype, promote_int=name != "mean")
        acc = _acc(in_dt) if in_dt.is_floating_point else out_dt
        k = Kernel(
            _size(in_dt),
            _size(acc),
            _size(out_dt),
            input_vec=8 if name in ("sum", "mean") and _size(in_dt) == 2 else 4,
            accumulates_in_output=not (in_dt in LOWP and in_dt == out_dt),
        )
        return Call(k, dims, in_dt)
    if name in ("amax", "amin"):
        dims = _dims(arg(0, "dim", []), ndim)
        s = x.element_size()
        return Call(Kernel(s, s, s, accumulates_in_output=x.dtype not in LOWP), dims, x.dtype)
    if name in ("max", "min") and func in (_aten.max.default, _aten.min.default):
        s = x.element_size()
        return Call(Kernel(s, s, s, accumulates_in_output=x.dtype not in LOWP), list(range(ndim)), x.dtype)
    if name in ("max", "min") and func in (_aten.max.dim, _aten.min.dim):
        s = x.element_size()
        return Call(Kernel(s, 16, s, accumulates_in_output=False), _dims(arg(0, "dim"), ndim), x.dtype)
    if name in ("argmax", "argmin"):
        dim = arg(0, "dim")
        s = x.element_size()
        k = Kernel(s, 16, 8, accumulates_in_output=False)
        return Call(k, _dims(dim, ndim), x.dtype) if dim is not None or x.is_contiguous() else None
    if name == "linalg_vector_norm":
        dims = _dims(arg(1, "dim"), ndim)
        if all(x.shape[d] == 1 for d in dims):
            return None  # abs / copy, no reduction kernel
        dtype = arg(3, "dtype")
        in_dt, out_dt = _sum_like_dtypes(x, dtype, promote_int=False)
        if not in_dt.is_floating_point:
            return None
        k = Kernel(
            _size(in_dt),
            _size(_acc(in_dt)),
            _size(out_dt),
            accumulates_in_output=not (in_dt in LOWP and in_dt == out_dt),
        )
        return Call(k, dims, in_dt)
    if name in ("var", "std", "var_mean", "std_mean") and func.__name__.endswith("correction"):
        if not x.dtype.is_floating_point:
            return None
        welford = 16 if _acc(x.dtype) == torch.float32 else 32  # mean, m2, n (int32), nf
        k = Kernel(x.element_size(), welford, x.element_size(), input_vec=2, accumulates_in_output=False)
        return Call(k, _dims(arg(0, "dim"), ndim), x.dtype)
    if name in ("any", "all"):
        if x.numel() <= 1:
            return None  # a copy, no reduction kernel
        dims = _dims(None if func in (_aten.any.default, _aten.all.default) else arg(0, "dim"), ndim)
        s = x.element_size()
        return Call(Kernel(s, s, 1), dims, x.dtype)
    return None


def _cast_copy(x: torch.Tensor, dtype: torch.dtype) -> tuple[int, list[int]]:
    """Bytes and element strides of ``x.to(dtype)`` (strides kept where ``x`` is dense)."""
    size = _size(dtype)
    dense = x.is_contiguous() or _non_overlapping_dense(x)
    strides = [int(s) for s in x.stride()] if dense else _contiguous(x.shape)
    return x.numel() * size, strides


def _non_overlapping_dense(x: torch.Tensor) -> bool:
    order = sorted((int(st), int(sz)) for sz, st in zip(x.shape, x.stride(), strict=True) if sz != 1)
    expected = 1
    for st, sz in order:
        if st != expected:
            return False
        expected *= sz
    return True


def op_scratch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: Device) -> list[int]:
    """Raw bytes of the blocks a CUDA reduction op allocates inside itself and frees on return
    (a cast copy of the input, an accumulation buffer, the staging buffer and the semaphores);
    empty for an op that takes none or that this does not model."""
    call = describe_call(func, args, kwargs)
    if call is None:
        return []
    x: torch.Tensor = args[0]
    sizes: list[int] = []
    strides = [int(s) for s in x.stride()]
    offset = int(x.storage_offset())
    if x.dtype != call.in_dtype:
        nbytes, strides = _cast_copy(x, call.in_dtype)
        sizes.append(nbytes)
        offset = 0
    it = build_iter(list(x.shape), strides, offset, call.dims, call.kernel.in_size, call.kernel.out_size)
    return sizes + launch_scratch(it, call.kernel, device)


#: The aten ops :func:`op_scratch` models (what a dispatch mode sees).
OPS = frozenset(
    {
        _aten.sum.default,
        _aten.sum.dim_IntList,
        _aten.nansum.default,
        _aten.prod.default,
        _aten.prod.dim_int,
        _aten.mean.default,
        _aten.mean.dim,
        _aten.amax.default,
        _aten.amin.default,
        _aten.max.default,
        _aten.min.default,
        _aten.max.dim,
        _aten.min.dim,
        _aten.argmax.default,
        _aten.argmin.default,
        _aten.linalg_vector_norm.default,
        _aten.var.correction,
        _aten.std.correction,
        _aten.var_mean.correction,
        _aten.std_mean.correction,
        _aten.any.default,
        _aten.any.dim,
        _aten.any.dims,
        _aten.all.default,
        _aten.all.dim,
        _aten.all.dims,
    }
)
