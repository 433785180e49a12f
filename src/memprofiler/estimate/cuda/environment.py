"""Every environment variable a CUDA estimate reads, and the line each gets in its notes when set.

torch reads these when the job starts (or at its first CUDA allocation or matrix product); the
estimate reads them from its own environment, the same way (:mod:`~memprofiler.estimate.cuda.workspaces`,
:mod:`~memprofiler.estimate.allocator.conf`, :mod:`~memprofiler.estimate.cuda.margins`). A value torch
would refuse is refused there with one line naming the variable; every variable that is set gets
one note saying what the estimate took from it, so a figure below the defaults' never goes
without a word.
"""

from __future__ import annotations

from collections.abc import Mapping

from memprofiler.estimate.allocator import conf as alloc_conf
from memprofiler.estimate.cuda.target import CudaTarget
from memprofiler.estimate.cuda.workspaces import WorkspacePlan, cublaslt_workspace_bytes, default_cublas_bytes
from memprofiler.units import format_bytes

#: The variables, what each sets, and what a bad value gets (the reliability guide's table).
VARIABLES: dict[str, tuple[str, str]] = {
    "CUBLAS_WORKSPACE_CONFIG": (
        "cuBLAS workspace per thread: every `:SIZE:COUNT` pair, SIZE KiB x COUNT, summed",
        "no pair: torch's default, with a warning; a number past 2**64 - 1: refused",
    ),
    "CUBLASLT_WORKSPACE_SIZE": (
        "cuBLASLt workspace in KiB (read as `std::stoi`: `12abc` is 12)",
        "no number or past a 32-bit int: the default, with a warning; negative with a separate "
        "cuBLASLt workspace: refused (torch fails to allocate it); negative with a shared one: the cuBLAS size",
    ),
    "TORCH_CUBLASLT_UNIFIED_WORKSPACE": (
        "whether cuBLASLt shares the cuBLAS workspace (`1`) or has its own (`0`)",
        "anything but `0` or `1`: ignored, as torch ignores it, with a note",
    ),
    "DISABLE_ADDMM_CUDA_LT": (
        "`1` turns the cuBLASLt path (and its workspace) off",
        "anything but `1`: the path stays on, with a note",
    ),
    "PYTORCH_CUDA_ALLOC_CONF": (
        "the caching allocator's options (read first)",
        "what torch refuses (an unknown key, `True`/`False` spelt otherwise, a value out of range, "
        "no number where one is due): refused; what the model does not follow: named in the notes",
    ),
    "PYTORCH_ALLOC_CONF": (
        "the same options, read when `PYTORCH_CUDA_ALLOC_CONF` is unset",
        "as `PYTORCH_CUDA_ALLOC_CONF`",
    ),
    "NCCL_BUFFSIZE": (
        "the NCCL buffer margin of a multi-rank estimate (bytes, `strtoll` base 0)",
        "not a positive size: the margin keeps NCCL's default 4 MiB, with a note",
    ),
}


def _size_note(name: str, raw: str, what: str, got: int, default: int) -> str:
    if got < default:
        where = f"below the default {format_bytes(default)}"
    elif got > default:
        where = f"above the default {format_bytes(default)}"
    else:
        where = "the default"
    return f"environment: {name}={raw!r}: {what} {format_bytes(got)} ({where})"


def workspace_notes(target: CudaTarget, plan: WorkspacePlan, env: Mapping[str, str]) -> list[str]:
    """One line per cuBLAS variable that is set: what the estimate took from it."""
    out: list[str] = []
    raw = env.get("CUBLAS_WORKSPACE_CONFIG")
    if raw is not None:
        out.append(
            _size_note(
                "CUBLAS_WORKSPACE_CONFIG",
                raw,
                "cuBLAS workspace per thread",
                plan.cublas,
                default_cublas_bytes(target),
            )
        )
    raw = env.get("CUBLASLT_WORKSPACE_SIZE")
    if raw is not None:
        if plan.unified or plan.lt_off:
            why = "shares the cuBLAS workspace" if plan.unified else "the cuBLASLt path is off"
            out.append(
                f"environment: CUBLASLT_WORKSPACE_SIZE={raw!r}: no separate cuBLASLt workspace ({why})"
            )
        else:
            default = cublaslt_workspace_bytes(target, {})
            out.append(
                _size_note(
                    "CUBLASLT_WORKSPACE_SIZE", raw, "cuBLASLt workspace per thread", plan.cublaslt, default
                )
            )
    raw = env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    if raw is not None:
        how = "cuBLASLt shares the cuBLAS workspace" if plan.unified else "cuBLASLt has its own workspace"
        ignored = "" if raw in ("0", "1") else " is not 0 or 1, which torch ignores (with a warning):"
        out.append(f"environment: TORCH_CUBLASLT_UNIFIED_WORKSPACE={raw!r}{ignored} {how}")
    raw = env.get("DISABLE_ADDMM_CUDA_LT")
    if raw is not None:
        out.append(
            f"environment: DISABLE_ADDMM_CUDA_LT={raw!r}: "
            + (
                "the cuBLASLt path is off (no cuBLASLt workspace)"
                if plan.lt_off
                else "not '1': the cuBLASLt path stays on"
            )
        )
    return out


def allocator_note(conf: alloc_conf.AllocConf) -> str:
    """The caching allocator's line: the settings followed, and each one the model does not follow."""
    if not conf.variable:
        return "caching allocator: defaults (PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF unset)"
    followed = []
    if conf.expandable_segments:
        followed.append("expandable_segments:True")
    if conf.max_split_size is not None:
        followed.append(f"max_split_size_mb:{conf.max_split_size >> 20}")
    if conf.max_non_split_rounding is not None:
        followed.append(f"max_non_split_rounding_mb:{conf.max_non_split_rounding >> 20}")
    if conf.garbage_collection_threshold:
        followed.append(
            f"garbage_collection_threshold:{conf.garbage_collection_threshold} (it acts only under "
            "torch.cuda.set_per_process_memory_fraction, which the estimate does not assume)"
        )
    if conf.roundup_power2_divisions:
        followed.append(f"roundup_power2_divisions:{conf.roundup_power2_divisions}")
    parts = [
        f"caching allocator: {conf.variable}={conf.text!r}: follows "
        + (", ".join(followed) or "the defaults")
    ]
    if conf.read_as:
        parts.append("read as torch reads it: " + ", ".join(conf.read_as))
    if conf.backend != "native":
        parts.append(
            f"backend:{conf.backend} hands memory to CUDA's own pool allocator: the reserved figure is the "
            "caching allocator's, a stand-in for it"
        )
    others = [item for item in conf.not_modelled if not item.startswith("backend:")]
    if others:
        parts.append(f"not modelled (the figures may be off by what they change): {', '.join(others)}")
    if conf.no_effect:
        parts.append(f"no effect on device memory: {', '.join(conf.no_effect)}")
    return "; ".join(parts)
