"""``CudaModel``: the parts of a CUDA target's device model, in the order the engine enters them.

Each part gives its dispatch mode, its notes and its stated margins (:class:`Part`); the
engine loops over them. The order is the modes' nesting: a mode entered later sees an op
first, so CUDA's dispatch rules (entered last) rewrite a call before the kernel scratch, the
workspaces and the custom-op census see what it became.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from torch import nn

from memprofiler.estimate.allocator.conf import AllocConf
from memprofiler.estimate.cuda.dispatch import CudaDispatch
from memprofiler.estimate.cuda.environment import allocator_note, workspace_notes
from memprofiler.estimate.cuda.kernel_scratch import KernelScratch
from memprofiler.estimate.cuda.loss_scratch import LossTemporaries
from memprofiler.estimate.cuda.margins import CustomOps, Margin, margins
from memprofiler.estimate.cuda.ops import OpHook
from memprofiler.estimate.cuda.optim import foreach_as_on_cuda
from memprofiler.estimate.cuda.stats import FloatStats
from memprofiler.estimate.cuda.target import CudaTarget
from memprofiler.estimate.cuda.workspaces import CONV_ENVELOPE, BlasWorkspaces, WorkspacePlan
from memprofiler.estimate.notes import CONV_SCRATCH
from memprofiler.estimate.parallel.fsdp_streams import stream_names
from memprofiler.estimate.part import Part


class _Hook(Part):
    """A part that looks at each op and says nothing afterwards."""

    def __init__(self, hook: OpHook) -> None:
        self._hook = hook

    def hook(self) -> OpHook | None:
        return self._hook


class Workspaces(Part):
    """cuBLAS / cuBLASLt / cuDNN workspaces held, and cuDNN's convolution scratch as a transient
    with its what-if envelope (a margin through the allocator's twin)."""

    def __init__(self, target: CudaTarget, plan: WorkspacePlan, tracker: Any) -> None:
        self.target = target
        self.plan = plan
        self.blas = BlasWorkspaces(self.plan, tracker.hold, tracker.transient)
        self._allocator = tracker.ledger.allocator

    def hook(self) -> OpHook | None:
        return self.blas

    def notes(self, notes: list[str]) -> list[str]:
        blas = self.blas
        if blas.convs:
            notes = [n for n in notes if n != CONV_SCRATCH]
            notes.append(
                f"cuDNN convolution scratch: a transient at each of {blas.convs} convolution calls, the size of "
                f"its larger input or output (output gradient in backward), up to {blas.conv_max:,} B; cuDNN's "
                "actual workspace depends on the algorithm it picks on the device"
            )
        if self.plan.held:
            parts = ", ".join(f"{name} thread {n:,} B" for name, n in self.plan.held.items())
            notes.append(f"workspaces (kept through the caching allocator, in the peak): {parts}")
        return notes + workspace_notes(self.target, self.plan, os.environ)

    def margins(self) -> list[tuple[str, int]]:
        twin = getattr(self._allocator, "mirror", None)
        if not self.blas.convs or twin is None:
            return []
        over = twin.peak_reserved - self._allocator.peak_reserved
        return [
            (
                "cuDNN convolution workspaces are cuDNN's choice: had each convolution taken "
                f"{CONV_ENVELOPE['forward']}x (forward) / {CONV_ENVELOPE['backward']}x (backward) its largest "
                "operand in float32 bytes, the most measured on an H200 (cuDNN 9.19), the caching allocator "
                f"would have reserved this much more (allocated peak {twin.peak_allocated:,} B)",
                max(over, 0),
            )
        ]


class Scratch(Part):
    """What attention, layer norm, reduction and embedding kernels allocate inside themselves."""

    def __init__(self, target: CudaTarget, tracker: Any) -> None:
        self.scratch = KernelScratch(tracker.phases, target)
        self._tracker = tracker

    def hook(self) -> OpHook | None:
        return self.scratch

    def notes(self, notes: list[str]) -> list[str]:
        self.scratch.log.host_scalars = self._tracker.host_rng_count
        return notes + self.scratch.log.notes()


class Stats(Part):
    """Float statistics CUDA kernels keep in float32 where the CPU's keep the input's dtype."""

    def __init__(self) -> None:
        self.stats = FloatStats()

    def hook(self) -> OpHook | None:
        return self.stats

    def notes(self, notes: list[str]) -> list[str]:
        line = self.stats.note()
        return [*notes, line] if line else notes


class Dispatch(Part):
    """CUDA's choices where the CPU's differ (attention, autocast, dropout, rms_norm, cuDNN)."""

    def __init__(self, target: CudaTarget, steps: int) -> None:
        self.dispatch = CudaDispatch(target)
        self._steps = steps

    def mode(self) -> contextlib.AbstractContextManager[Any]:
        return self.dispatch

    def notes(self, notes: list[str]) -> list[str]:
        return notes + self.dispatch.notes()

    def margins(self) -> list[tuple[str, int]]:
        return list(self.dispatch.cudnn.margins(self._steps))


class Optimizer(Part):
    """Where the optimizer's step runs on CUDA: foreach kernels, step counts on the host."""

    def __init__(self, optimizer: torch.optim.Optimizer, tracker: Any) -> None:
        self._opt = optimizer
        self._tracker = tracker
        self._foreach = foreach_as_on_cuda(optimizer)

    def notes(self, notes: list[str]) -> list[str]:
        out = list(notes)
        if self._foreach:
            out.append(
                f"optimizer: {type(self._opt).__name__} steps with torch's foreach kernels, its default on CUDA "
                "(all parameters at once; the CPU default is a loop over parameters)"
            )
        state = [v for s in self._opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        on_host = sum(1 for v in state if self._tracker._on_host(v))
        if on_host:
            out.append(
                f"optimizer: {on_host} state tensor(s) made from Python data in its step (a non-capturable "
                "optimizer's step counts) stay on the host, as torch keeps them: not in the device's peak"
            )
        return out


class Allocator(Part):
    """The caching allocator's settings, what it released to make room, and its pools per stream."""

    def __init__(self, conf: AllocConf, tracker: Any, model: nn.Module) -> None:
        self._conf = conf
        self._allocator = tracker.ledger.allocator
        self._tracker = tracker
        self._model = model

    def notes(self, notes: list[str]) -> list[str]:
        out = [*notes, allocator_note(self._conf)]
        if self._allocator.released:
            out.append(
                f"the allocator released {self._allocator.released:,} B of cached segments to make room "
                "(as it does before an OOM)"
            )
        by_stream = self._allocator.by_stream
        if len(by_stream) > 1:
            names = stream_names(self._model, self._tracker.streams)
            pools = "; ".join(
                f"{names.get(s, f'stream {s}')} {f.peak_allocated:,} B in blocks, {f.peak_reserved:,} B reserved"
                for s, f in sorted(by_stream.items())
            )
            out.append(
                "caching allocator pools per stream (a block freed in one stream's pool is not reused by "
                f"another; FSDP2's buffers are allocated on its own streams), peaks: {pools}"
            )
        return out


class CudaModel:
    """A CUDA target's device model over one tracker: its parts, in the order they are entered."""

    def __init__(
        self,
        target: CudaTarget,
        tracker: Any,
        optimizer: torch.optim.Optimizer,
        conf: AllocConf,
        workspaces: WorkspacePlan,
        steps: int,
        model: nn.Module,
    ) -> None:
        self.target = target
        self.custom = CustomOps()
        self.workspaces = Workspaces(target, workspaces, tracker)
        self.parts: list[Part] = [
            Optimizer(optimizer, tracker),
            _Hook(self.custom),
            self.workspaces,
            Scratch(target, tracker),
            LossTemporaries(target, tracker),
            Stats(),
            Dispatch(target, steps),
            Allocator(conf, tracker, model),
        ]

    def workspace_bytes(self) -> dict[str, int]:
        return self.workspaces.plan.by_kind()

    def margins(self, models: list[nn.Module], peak: int, strategy: str, world_size: int) -> list[Margin]:
        """Every stated margin: the parts' own, then those :func:`margins` finds in the models (the
        caller's and the estimate's copy)."""
        stated = [m for part in self.parts for m in part.margins()]
        return margins(models, peak, strategy, world_size, self.custom.names, cudnn=stated)
