"""An estimate's outputs: the terminal table and ``memory_estimate.yaml``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.estimate.result import MemoryEstimate
from memprofiler.output.writers import write_yaml
from memprofiler.units import format_bytes


def render_table(
    results: list[MemoryEstimate],
    memory: int | None,
    reserve: int,
    labels: tuple[str, list[str]] | None = None,
) -> str:
    """One row per batch size: peak, allocator view, top categories, module at peak, verdict;
    ``labels``: a first column (its title, a value per row) saying what each row's plan changes."""
    from rich.console import Console
    from rich.table import Table

    first = results[0]
    table = Table(
        title=f"memory estimate per rank: {first.strategy}, world_size {first.world_size}, {first.precision}, "
        f"{first.target or first.device}"
    )
    if labels is not None:
        table.add_column(labels[0])
    for col in (
        "batch",
        "peak (allocated)",
        "reserved",
        "tensors",
        "params",
        "grads",
        "opt state",
        "activations",
        "peak at",
    ):
        table.add_column(col, justify="left" if col == "peak at" else "right")
    if memory is not None:
        table.add_column("fits " + format_bytes(memory), justify="right")
    for i, est in enumerate(results):
        cat = est.by_category
        row = [labels[1][i]] if labels is not None else []
        row += [
            str(est.batch_size),
            format_bytes(est.peak_bytes),
            format_bytes(est.reserved_peak_bytes),
            format_bytes(est.tensor_peak_bytes),
            format_bytes(est.resident.get("parameters", 0)),
            format_bytes(est.resident.get("gradients", 0)),
            format_bytes(est.resident.get("optimizer_state", 0)),
            format_bytes(cat.get("activations", 0)),
            f"{est.peak_at} ({est.peak_phase}, step {est.peak_step})",
        ]
        if memory is not None:
            head = est.headroom(memory, reserve)
            row.append(f"yes, {format_bytes(head)} free" if head >= 0 else f"NO, {format_bytes(-head)} over")
        table.add_row(*row)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(table)
    notes = list(dict.fromkeys(n for est in results for n in est.notes))  # first seen first: the target
    lines = [console.export_text().rstrip()]
    lines += [f"note: {n}" for n in notes]
    lines.append("not modelled: " + "; ".join(first.not_modelled))
    return "\n".join(lines)


def write_estimates(
    save_dir: Path,
    results: list[MemoryEstimate],
    memory: int | None,
    reserve: int,
    auto: bool = False,
    extra: list[dict[str, Any]] | None = None,
) -> Path:
    """Write ``memory_estimate.yaml`` (YAML integrity lines included); ``extra``: more keys for
    each estimate (what its plan changed)."""

    data: dict[str, Any] = {
        "kind": "memory_estimate",
        "device_memory_bytes": memory,
        "reserve_bytes": reserve,
        "estimates": [{**r.to_dict(), **(extra[i] if extra else {})} for i, r in enumerate(results)],
    }
    if memory is not None:
        fitting = [r.batch_size for r in results if r.fits(memory, reserve) and r.batch_size is not None]
        data["largest_fitting_batch_size"] = max(fitting) if fitting else None
    data["auto_batch_size"] = auto
    return write_yaml(save_dir / layout.MEMORY_ESTIMATE_YAML, data)
