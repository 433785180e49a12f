"""Torch-free reader of ``memory_estimate.yaml`` and the estimated-vs-measured line.

``memprofiler report`` prints the line when the run directory holds an estimate;
``memprofiler diff ESTIMATE RUN`` prints it for an estimate put beside a measured run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from memprofiler import layout, metrics
from memprofiler.analysis.runs.artifacts import RunArtifacts, read_yaml
from memprofiler.errors import ArtifactError
from memprofiler.units import format_bytes

#: Measured figures an estimate compares with, best first: the CUDA allocator's peak, then the
#: module-wise trackers' peaks (CPU runs), which count the same tensors the estimate does.
MEASURED_KEYS = (metrics.CUDA_ALLOCATED_PEAK, metrics.FSDP_PEAK_TOTAL, metrics.MODULE_MEM_PEAK_TOTAL)


@dataclass(frozen=True)
class EstimateRow:
    """One estimated configuration (one batch size)."""

    batch_size: int | None
    peak_bytes: int
    tensor_peak_bytes: int
    reserved_peak_bytes: int
    strategy: str
    world_size: int
    device: str


@dataclass(frozen=True)
class EstimateFile:
    path: Path
    rows: list[EstimateRow]
    device_memory_bytes: int | None
    largest_fitting_batch_size: int | None


def find_estimate(path: str | os.PathLike[str]) -> Path | None:
    """``path`` itself when it is a ``memory_estimate.yaml``, else the one inside the directory."""
    p = Path(path)
    if p.is_file() and p.name == layout.MEMORY_ESTIMATE_YAML:
        return p
    cand = p / layout.MEMORY_ESTIMATE_YAML
    return cand if cand.is_file() else None


def load_estimate(path: Path) -> EstimateFile:
    """Read a ``memory_estimate.yaml``.

    Raises:
        ArtifactError: the file is not an estimate memprofiler wrote (one line naming it).
    """
    data = read_yaml(path)
    if not isinstance(data, dict) or data.get("kind") != "memory_estimate" or not data.get("estimates"):
        raise ArtifactError(f"{path}: not a memprofiler memory estimate (no `estimates`); re-run `estimate`")
    rows = []
    for e in data["estimates"]:
        try:
            rows.append(
                EstimateRow(
                    batch_size=e.get("batch_size"),
                    peak_bytes=int(e["peak_bytes"]),
                    tensor_peak_bytes=int(e["tensor_peak_bytes"]),
                    reserved_peak_bytes=int(e.get("reserved_peak_bytes", 0)),
                    strategy=str(e.get("strategy", "")),
                    world_size=int(e.get("world_size", 1)),
                    device=str(e.get("device", "")),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ArtifactError(
                f"{path}: an entry of `estimates` lacks `peak_bytes`; re-run `estimate`"
            ) from None
    return EstimateFile(path, rows, data.get("device_memory_bytes"), data.get("largest_fitting_batch_size"))


def measured_peak(run: RunArtifacts) -> tuple[str, float] | None:
    """The run's largest measured peak over all snapshots, by the first key in ``MEASURED_KEYS`` it has."""
    best: dict[str, float] = {}  # one pass: a streamed run is read once
    for _, m in run.iter_snapshots():
        for key in MEASURED_KEYS:
            v = m.get(key)
            if isinstance(v, (int, float)) and (key not in best or float(v) > best[key]):
                best[key] = float(v)
    return next(((key, best[key]) for key in MEASURED_KEYS if key in best), None)


def compare_line(est: EstimateFile, run: RunArtifacts | None) -> str:
    """``estimated 41.2 GiB, measured 40.7 GiB (allocated_bytes.all.peak, ratio 1.012)``."""
    row = (
        est.rows[-1]
        if est.largest_fitting_batch_size is None
        else next((r for r in est.rows if r.batch_size == est.largest_fitting_batch_size), est.rows[-1])
    )
    measured = measured_peak(run) if run is not None else None
    # A CPU run has no allocator: compare the tensor bytes, which its trackers count.
    estimated = (
        row.peak_bytes if measured is None or measured[0] == MEASURED_KEYS[0] else row.tensor_peak_bytes
    )
    where = f"batch {row.batch_size}, {row.strategy} x{row.world_size}"
    text = f"estimated {format_bytes(estimated)} per rank ({where})"
    if measured is None:
        return text + ", measured: no comparable peak in the run (cuda stats or a module-wise tracker)"
    key, value = measured
    ratio = estimated / value if value else float("nan")
    return text + f", measured {format_bytes(value)} ({key}, ratio {ratio:.3f})"


def estimate_only(path: str | os.PathLike[str]) -> Path | None:
    """The estimate at ``path`` when it is one (the file, or a directory with it and no run)."""
    found = find_estimate(path)
    if found is None or Path(path).is_file():
        return found
    return None if any(Path(path).glob("rank_*_memory_stats.yaml")) else found


def diff_line(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> str | None:
    """For ``memprofiler diff``: the line when one side is an estimate and the other a run."""
    from memprofiler.analysis.runs.artifacts import load_run

    for est_side, run_side in ((a, b), (b, a)):
        est = estimate_only(est_side)
        if est is not None:
            return compare_line(load_estimate(est), load_run(run_side))
    return None


def report_line(path: str | os.PathLike[str], run: RunArtifacts | None) -> str | None:
    """For ``memprofiler report``: the line for an estimate in ``path`` (or beside ``run``)."""
    found = find_estimate(path) or (find_estimate(run.root) if run is not None else None)
    return compare_line(load_estimate(found), run) if found is not None else None
