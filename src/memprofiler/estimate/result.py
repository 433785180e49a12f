"""The typed result of an estimate: :class:`MemoryEstimate` (torch-free, YAML-ready)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: The first of :data:`NOT_MODELLED`, where nothing kept the CUDA context back (from Python; see
#: :func:`context_counted` for a budget that did).
CONTEXT_AND_NCCL = "CUDA context and NCCL buffers (use `reserve`; a distributed run adds a stated margin)"

#: What no estimate models; printed with every estimate and written into its YAML.
NOT_MODELLED = (
    CONTEXT_AND_NCCL,
    "FSDP2's CPUOffloadPolicy (refused)",
    "context parallelism; pipeline schedules other than GPipe, 1F1B and Interleaved1F1B, and a pipeline "
    "beside data or tensor parallelism; loss parallelism (loss_parallel(), whose backward DTensor refuses "
    "on fake tensors)",
    "float8 training (torchao's Float8Linear, fp8 all-gather): counted as the ops the fake step runs",
    "memory of torch.compile'd graphs and CUDA graphs (a compiled model gets a stated margin)",
    "scratch a kernel allocates inside itself beyond the cuBLAS workspaces, the stated cuDNN bound and, "
    "for a CUDA target, the attention, layer norm, reduction, embedding backward and loss scratch "
    "replayed from torch's source",
)


def context_counted(not_modelled: list[str], context: str) -> list[str]:
    """``not_modelled`` as it reads where a budget kept ``context`` (bytes, in words) back for the
    CUDA context: the context is still not modelled, but no longer left to the reader.

    Example:
        >>> context_counted(list(NOT_MODELLED[:2]), "512.00 MiB")[0].split("; ")[1]
        'the CUDA context is not modelled but kept back in the budget (512.00 MiB)'
    """
    counted = (
        "NCCL buffers (a distributed run adds a stated margin); the CUDA context is not modelled but "
        f"kept back in the budget ({context})"
    )
    return [counted if item == CONTEXT_AND_NCCL else item for item in not_modelled]


@dataclass
class StagePeak:
    """One pipeline rank's peak (:attr:`MemoryEstimate.stages`)."""

    rank: int
    stages: list[int]
    """The pipeline stages the rank holds."""
    peak_bytes: int
    tensor_peak_bytes: int
    reserved_peak_bytes: int
    margin_bytes: int
    peak_at: str
    peak_phase: str


@dataclass
class MemoryEstimate:
    """Per-rank memory of a training step, estimated by running it on fake tensors.

    All byte figures are per rank. ``by_category`` is the breakdown at the peak; ``resident``
    holds the bytes that outlive the step (parameters, gradients, optimizer state), which
    equal their analytic values exactly.

    Example:
        >>> est = MemoryEstimate(peak_bytes=2048, tensor_peak_bytes=2000)
        >>> est.fits(4096, reserve=1024)
        True
    """

    peak_bytes: int
    """Modelled ``allocated_bytes.all.peak`` of the caching allocator (the tensor peak on CPU)."""
    tensor_peak_bytes: int
    """Peak of the live tensors' own bytes, before allocator rounding."""
    reserved_peak_bytes: int = 0
    """Modelled ``reserved_bytes.all.peak``: segments the allocator holds at the peak."""
    by_category: dict[str, int] = field(default_factory=dict)
    """Live tensor bytes per category at the peak."""
    resident: dict[str, int] = field(default_factory=dict)
    """Bytes of parameters, gradients and optimizer state after the last step (per rank)."""
    saved_bytes: int = 0
    """Bytes saved for backward in one step (the definition of ``saved_tensors.unique_bytes``)."""
    peak_module: str = ""
    """Innermost module running when the peak was reached."""
    peak_op: str = ""
    """The op that allocated the byte that made the peak (``aten.mm``, ``aten._log_softmax``)."""
    peak_phase: str = ""
    """``forward``, ``backward`` or ``optimizer``."""
    peak_step: int = 0
    """The step (1-based) in which the peak was reached."""
    strategy: str = "single"
    world_size: int = 1
    precision: str = "32-true"
    device: str = "cuda"
    steps: int = 2
    fake: bool = True
    batch_size: int | None = None
    notes: list[str] = field(default_factory=list)
    """What this estimate assumed or could not model."""
    target: str = ""
    """The CUDA device and torch release modelled (``H200 (sm90), torch 2.11``); empty for ``cpu``."""
    workspace_bytes: dict[str, int] = field(default_factory=dict)
    """Library workspaces held at the end (``cublas``, ``cublaslt``), included in ``peak_bytes``."""
    torch_rules: dict[str, str] = field(default_factory=dict)
    """Which torch each part followed (CUDA target): the target's ``torch_version`` for the rules
    written per release (workspaces, kernel scratch), the installed torch for what runs (FSDP2,
    checkpointing, autograd, the optimizers)."""
    margin_bytes: int = 0
    """Stated margins for what is not modelled (custom ops, torch.compile, NCCL; see ``notes``),
    added to the "fits" decision."""
    not_modelled: list[str] = field(default_factory=lambda: list(NOT_MODELLED))
    pipeline: str = ""
    """The pipeline (``1F1B, 2 stages on 2 ranks, 4 micro-batches``); empty without one. The
    figures above are then those of the rank whose peak is highest, ``stages`` each rank's."""
    stages: list[StagePeak] = field(default_factory=list)
    """Each pipeline rank's peak, by rank."""

    @property
    def peak_at(self) -> str:
        """Where the peak happened: the module, and the op that made it; the op alone outside
        every submodule (``aten.nll_loss_forward in the model's own forward``)."""
        op = self.peak_op
        where = {
            "(root)": "the model's own forward",
            "(outside forward)": "no module",
            "(none)": "no module",
        }.get(self.peak_module)
        if where is None:
            return f"{self.peak_module}: {op}" if op else self.peak_module
        return f"{op} in {where}" if op else self.peak_module

    def fits(self, device_memory: int, reserve: int = 0) -> bool:
        """Whether the modelled reserved peak plus ``reserve`` fits in ``device_memory`` bytes."""
        return self.headroom(device_memory, reserve) >= 0

    def headroom(self, device_memory: int, reserve: int = 0) -> int:
        """``device_memory`` minus the modelled reserved peak (or the peak), the margins and ``reserve``."""
        return device_memory - max(self.reserved_peak_bytes, self.peak_bytes) - self.margin_bytes - reserve

    def stage_peak(self, rank: int, stages: list[int]) -> StagePeak:
        """This estimate as rank ``rank`` of a pipeline, holding ``stages``."""
        return StagePeak(
            rank=rank,
            stages=stages,
            peak_bytes=self.peak_bytes,
            tensor_peak_bytes=self.tensor_peak_bytes,
            reserved_peak_bytes=self.reserved_peak_bytes,
            margin_bytes=self.margin_bytes,
            peak_at=self.peak_at,
            peak_phase=self.peak_phase,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, so ``yaml.safe_load`` reads it back."""
        return asdict(self)
