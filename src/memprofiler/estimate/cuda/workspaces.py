"""cuBLAS and cuBLASLt workspaces, allocated as torch allocates them (``CublasHandlePool.cpp``).

torch keeps one cuBLAS handle per thread and device, and one workspace per (handle, stream),
allocated through the caching allocator the first time the thread runs a matrix product and
kept until ``torch._C._cuda_clearCublasWorkspaces()``. A training step multiplies matrices on
two threads: forward (and the optimizer) on the Python thread, backward on autograd's device
thread; so a step holds two workspaces. The rules, by torch release:

- cuBLAS workspace (``getChosenWorkspaceSize``): ``CUBLAS_WORKSPACE_CONFIG`` is read as every
  ``:SIZE:COUNT`` pair (SIZE in KiB), summed as SIZE x COUNT KiB; unset (or unparseable), the
  default is 32 MiB on Hopper (sm90) and ``:4096:2:16:8`` (8 MiB + 128 KiB) elsewhere; from
  torch 2.12 the 32 MiB default covers Blackwell (sm10x, sm12x) too.
- cuBLASLt workspace, used by ``addmm`` with a 1-D bias (``gemm_and_bias``, Linear's forward):
  ``CUBLASLT_WORKSPACE_SIZE`` KiB, default 1,024 KiB, capped at the cuBLAS size. Up to torch
  2.11 it is its own allocation per (handle, stream) unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``;
  from 2.12 the Lt path shares the cuBLAS workspace unless that variable is ``0``.
  ``DISABLE_ADDMM_CUDA_LT=1`` turns the Lt path off. (Before torch 2.9 the Lt workspace was
  allocated per call rather than kept; the 2.9 rule is used for those releases, 1 MiB at most.)

Only the estimate's dispatch sees which products run where; this module decides the bytes.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from memprofiler.errors import ConfigError
from memprofiler.estimate.cuda.ops import OpHook
from memprofiler.estimate.cuda.target import CudaTarget

KiB = 1024
MiB = 1 << 20
#: ``:4096:2:16:8``: torch's default outside Hopper (and Blackwell from 2.12).
DEFAULT_SMALL = 4096 * KiB * 2 + 16 * KiB * 8
DEFAULT_LARGE = 4096 * KiB * 8  # 32 MiB
DEFAULT_LT = 1024 * KiB
_PAIR = re.compile(r":([0-9]+):([0-9]+)")
_STOI = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")
SIZE_T_MAX = (1 << 64) - 1

_aten = torch.ops.aten
#: Ops that run a cuBLAS GEMM/GEMV on CUDA (linear and matmul reach them at dispatch).
BLAS_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten.baddbmm.default,
    _aten.addbmm.default,
    _aten.addmv.default,
    _aten.mv.default,
    _aten.dot.default,
    _aten.vdot.default,
    _aten._addmm_activation.default,
}


def _env_flag(env: Mapping[str, str], name: str) -> bool | None:
    """``c10::utils::check_env``: exactly ``1`` -> True, exactly ``0`` -> False; anything else is
    ignored (torch warns and keeps its default), as is an unset variable: None."""
    val = env.get(name)
    return True if val == "1" else False if val == "0" else None


def default_cublas_bytes(target: CudaTarget) -> int:
    major, minor = target.capability
    large = major in (9, 10, 12) if target.torch_version >= (2, 12) else (major, minor) == (9, 0)
    return DEFAULT_LARGE if large else DEFAULT_SMALL


def cublas_workspace_bytes(target: CudaTarget, env: Mapping[str, str] | None = None) -> int:
    """Bytes of one cuBLAS workspace (``parseChosenWorkspaceSize``).

    Every ``:SIZE:COUNT`` match is read with ``std::stoull`` and summed as SIZE x 1024 x COUNT in
    ``size_t`` (modulo 2**64, as torch computes it); no match: torch warns and takes the default.

    Raises:
        ConfigError: a number past 2**64 - 1, where ``stoull`` throws and torch's first matrix
            product fails; names the variable.
    """
    env = os.environ if env is None else env
    default = default_cublas_bytes(target)
    val = env.get("CUBLAS_WORKSPACE_CONFIG")
    if val is None:
        return default
    pairs = _PAIR.findall(val)
    if not pairs:
        warnings.warn(
            f"Could not parse CUBLAS_WORKSPACE_CONFIG={val!r}; torch uses its default of {default} bytes",
            stacklevel=2,
        )
        return default
    total = 0
    for size, count in pairs:
        if int(size) > SIZE_T_MAX or int(count) > SIZE_T_MAX:
            raise ConfigError(
                "CUBLAS_WORKSPACE_CONFIG",
                f"got {val!r}: a number past 2**64 - 1, which torch cannot read (std::stoull throws at its "
                "first matrix product); use :SIZE:COUNT pairs with SIZE in KiB, e.g. :4096:8",
            )
        total = (total + int(size) * KiB * int(count)) % (SIZE_T_MAX + 1)
    return total


def lt_unified(target: CudaTarget, env: Mapping[str, str] | None = None) -> bool:
    """Whether the cuBLASLt path reuses the cuBLAS workspace instead of allocating its own."""
    flag = _env_flag(os.environ if env is None else env, "TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    if target.torch_version >= (2, 12):
        return flag is not False
    return flag is True


def stoi(text: str) -> int | None:
    """``std::stoi``: the leading base-10 integer of ``text`` (after blanks, with a sign); None
    where it throws (no number, or past a 32-bit int)."""
    found = _STOI.match(text)
    if not found:
        return None
    value = int(found.group(0))
    return value if -(1 << 31) <= value < (1 << 31) else None


def cublaslt_workspace_bytes(target: CudaTarget, env: Mapping[str, str] | None = None) -> int:
    """Bytes of one separate cuBLASLt workspace (``getCUDABlasLtWorkspaceSize``).

    ``CUBLASLT_WORKSPACE_SIZE`` is read with ``std::stoi`` in KiB (``12abc`` is 12; no number, or
    one past a 32-bit int: torch warns and keeps its default), then multiplied by 1024 in
    ``size_t``: a negative size wraps to nearly 2**64 bytes, which a shared (unified) workspace
    caps at the cuBLAS size and a separate one fails to allocate.

    Raises:
        ConfigError: a negative size where the cuBLASLt workspace is its own allocation.
    """
    env = os.environ if env is None else env
    flag = _env_flag(env, "TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    cublas = cublas_workspace_bytes(target, env)
    # the size is parsed as unified unless the variable says otherwise (2.11: also when unset)
    size_unified = flag is not False
    size = cublas if (size_unified and target.torch_version >= (2, 12)) else DEFAULT_LT
    val = env.get("CUBLASLT_WORKSPACE_SIZE")
    if val is not None:
        kib = stoi(val)
        if kib is None:
            warnings.warn(
                f"invalid CUBLASLT_WORKSPACE_SIZE={val!r}; torch uses {size // KiB} KiB", stacklevel=2
            )
        elif kib < 0 and not size_unified:
            raise ConfigError(
                "CUBLASLT_WORKSPACE_SIZE",
                f"got {val!r}: torch multiplies it by 1024 as an unsigned size ({(kib * KiB) % (SIZE_T_MAX + 1):,} "
                "bytes) and its first matrix product with a bias fails to allocate that; use a size in KiB >= 0 "
                f"(default {DEFAULT_LT // KiB})",
            )
        else:
            size = (kib * KiB) % (SIZE_T_MAX + 1)
    return min(size, cublas) if size_unified else size


def lt_disabled(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get("DISABLE_ADDMM_CUDA_LT") == "1"


def uses_lt(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """``isInputCompliesAddmmCudaLt``: addmm with a contiguous 1-D bias, beta 1, no 1-row operand."""
    if func not in (_aten.addmm.default, _aten._addmm_activation.default) or len(args) < 3:
        return False
    bias, m1, m2 = args[:3]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    if beta != 1 or bias.dim() != 1 or not bias.is_contiguous() or m2.dim() != 2 or m1.dim() != 2:
        return False
    if bias.shape[0] != m2.shape[1] or min(*m1.shape, *m2.shape) <= 1:
        return False
    return m1.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass
class WorkspacePlan:
    """What a target allocates: per thread, the bytes of each workspace kind."""

    cublas: int
    cublaslt: int
    unified: bool
    lt_off: bool
    lt_sets_up_cublas: bool
    held: dict[str, int] = field(default_factory=dict)
    """``"cublas forward thread"`` -> bytes, in the order they were allocated."""

    @classmethod
    def for_target(cls, target: CudaTarget, env: Mapping[str, str] | None = None) -> WorkspacePlan:
        env = os.environ if env is None else env
        return cls(
            cublas=cublas_workspace_bytes(target, env),
            cublaslt=cublaslt_workspace_bytes(target, env),
            unified=lt_unified(target, env),
            lt_off=lt_disabled(env),
            # up to 2.11 the Lt handle is the cuBLAS handle fetched with its workspace set up
            lt_sets_up_cublas=target.torch_version < (2, 12),
        )

    def needed(self, thread: str, lt: bool) -> list[tuple[str, int]]:
        """Workspaces a product on ``thread`` allocates now (none once the thread has them)."""
        out: list[tuple[str, int]] = []
        lt = lt and not self.lt_off
        if (not lt or self.unified or self.lt_sets_up_cublas) and f"cublas {thread}" not in self.held:
            out.append((f"cublas {thread}", self.cublas))
        if lt and not self.unified and f"cublaslt {thread}" not in self.held:
            out.append((f"cublaslt {thread}", self.cublaslt))
        for name, n in out:
            self.held[name] = n
        return out

    def total(self) -> int:
        return sum(self.held.values())

    def by_kind(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for name, n in self.held.items():
            kind = name.split(" ", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + n
        return kinds


def current_thread() -> str:
    """``backward`` inside autograd's engine (CUDA runs it on a device thread), else ``forward``."""
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


CONV_OPS = {_aten.convolution.default, _aten.convolution_backward.default}


def _conv_operands(func: Any, args: tuple[Any, ...], out: Any, weight: bool) -> list[torch.Tensor]:
    """A convolution's input, weight and output (forward), or its output gradient and input
    (backward), with ``weight`` the weight too."""
    backward = func is _aten.convolution_backward.default
    n = 3 if backward and weight else 2
    tensors = [a for a in args[:n] if isinstance(a, torch.Tensor)]
    if not backward and isinstance(out, torch.Tensor):
        tensors.append(out)
    return tensors


def conv_scratch_bound(func: Any, args: tuple[Any, ...], out: Any) -> int:
    """The estimate's figure for cuDNN's workspace at one convolution: its largest operand (input,
    weight or output forward; output gradient or input backward).

    cuDNN picks an algorithm per call (heuristics, or timing under ``cudnn.benchmark``) and torch
    allocates that algorithm's workspace through the caching allocator for the call only. The
    size is cuDNN's, not knowable here, and this is a typical figure rather than a bound (an H200
    took up to 4.94x it): :func:`conv_workspace_envelope` gives the fits margin its figure.
    """
    return max(
        (t.numel() * t.element_size() for t in _conv_operands(func, args, out, weight=False)), default=0
    )


#: The most cuDNN's workspace measured, as a multiple of a convolution's largest operand counted in
#: float32 bytes (input, weight, output; backward: output gradient, input, weight), rounded up to a
#: quarter: 80 convolutions on an H200 (cuDNN 9.19, torch 2.11, ``cudnn.benchmark`` off; 2-D and
#: 1-D, strided, grouped and depthwise, float32 / bfloat16, contiguous / channels-last), largest
#: 2.74 forward and 4.94 backward (``tests/fixtures/gpu_h200/conv_workspaces_h200.json``, measured
#: by ``tools/gpu_probe/conv_ws.py``). A measured envelope, not a rule: the algorithm, and so its
#: workspace, is cuDNN's choice on the device.
CONV_ENVELOPE = {"forward": 2.75, "backward": 5.0}


def conv_workspace_envelope(func: Any, args: tuple[Any, ...], out: Any) -> int:
    """What one convolution's workspace may reach (:data:`CONV_ENVELOPE`), for the fits margin."""
    largest = max((t.numel() for t in _conv_operands(func, args, out, weight=True)), default=0) * 4
    kind = "backward" if func is _aten.convolution_backward.default else "forward"
    return int(largest * CONV_ENVELOPE[kind])


class BlasWorkspaces(OpHook):
    """Sees every matrix product and convolution: ``hold(name, nbytes)`` for each new cuBLAS
    workspace, ``transient(name, nbytes, what_if)`` for each convolution's cuDNN scratch, with
    the envelope it might take instead (the margin's figure)."""

    def __init__(self, plan: WorkspacePlan, hold: Any, transient: Any = None) -> None:
        self.plan = plan
        self.hold = hold
        self.transient = transient
        self.convs = 0
        self.conv_max = 0

    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        if func in BLAS_OPS:
            for name, n in self.plan.needed(current_thread(), uses_lt(func, args, kwargs)):
                self.hold(name, n)
        elif func in CONV_OPS and self.transient is not None:
            n = conv_scratch_bound(func, args, out)
            self.convs += 1
            self.conv_max = max(self.conv_max, n)
            self.transient("cudnn", n, conv_workspace_envelope(func, args, out))
        return out
