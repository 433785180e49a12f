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
    lines = [console.export_text().rstrip(), *note_lines(results, labels, memory, reserve)]
    lines.append("not modelled: " + "; ".join(first.not_modelled))
    return "\n".join(lines)


#: Beyond this many rows, a note of some rows only is printed for the rows the answer rests on.
ALL_ROWS_NOTES = 4


def note_lines(
    results: list[MemoryEstimate],
    labels: tuple[str, list[str]] | None = None,
    memory: int | None = None,
    reserve: int = 0,
) -> list[str]:
    """Each note once, first seen first (the target). A note that not every row has names its rows
    (``note for batch 12 (checkpointing on): ...``), so a figure in it is read beside its own row.
    Over :data:`ALL_ROWS_NOTES` rows with a device memory (a batch search), those notes are printed
    for the rows the answer rests on only, the largest batch that fits and the smallest that does
    not (of each label); one line says where the others are.

    Example:
        >>> a, b = (MemoryEstimate(peak_bytes=1, tensor_peak_bytes=1, batch_size=n) for n in (1, 2))
        >>> a.notes, b.notes = ["target: H100"], ["target: H100", "released 1 B"]
        >>> note_lines([a, b])
        ['note: target: H100', 'note for batch 2: released 1 B']
    """
    rows: dict[str, list[int]] = {}
    for i, est in enumerate(results):
        for n in est.notes:
            if i not in rows.setdefault(n, []):
                rows[n].append(i)
    shown = _answer_rows(results, labels, memory, reserve)

    def row(i: int) -> str:
        label = f" ({labels[0]} {labels[1][i]})" if labels is not None else ""
        return f"batch {results[i].batch_size}{label}"

    lines: list[str] = []
    left_out: set[int] = set()
    for n, at in rows.items():
        if len(at) == len(results):
            lines.append(f"note: {n}")
            continue
        left_out.update(i for i in at if i not in shown)
        if at := [i for i in at if i in shown]:
            lines.append(f"note for {', '.join(row(i) for i in at)}: {n}")
    if left_out:
        lines.append(
            f"note: the notes of the {len(left_out)} other rows are in each estimate's `notes` "
            "in memory_estimate.yaml"
        )
    return lines


def _answer_rows(
    results: list[MemoryEstimate], labels: tuple[str, list[str]] | None, memory: int | None, reserve: int
) -> set[int]:
    """Every row, or over :data:`ALL_ROWS_NOTES` rows of a search: per label, the largest batch
    that fits and the smallest that does not."""
    if memory is None or len(results) <= ALL_ROWS_NOTES:
        return set(range(len(results)))
    groups: dict[str, list[int]] = {}
    for i in range(len(results)):
        groups.setdefault(labels[1][i] if labels is not None else "", []).append(i)
    shown: set[int] = set()
    for members in groups.values():
        fits = [i for i in members if results[i].headroom(memory, reserve) >= 0]
        over = [i for i in members if i not in fits]
        if fits:
            shown.add(max(fits, key=lambda i: results[i].batch_size or 0))
        if over:
            shown.add(min(over, key=lambda i: results[i].batch_size or 0))
    return shown


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
