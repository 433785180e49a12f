"""``memprofiler report`` / ``diff`` put an estimate beside the measured run of the same config."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from memprofiler import layout
from memprofiler.__main__ import main
from memprofiler.estimate.output import write_estimates
from memprofiler.estimate.result import MemoryEstimate

GiB = 2**30


def _estimate_dir(root: Path) -> Path:
    est = MemoryEstimate(
        peak_bytes=int(41.2 * GiB),
        tensor_peak_bytes=int(41.0 * GiB),
        reserved_peak_bytes=42 * GiB,
        batch_size=8,
    )
    write_estimates(root, [est], memory=80 * GiB, reserve=0)
    return root


def _measured_run(real_runs: dict[str, Path], root: Path) -> Path:
    shutil.copytree(real_runs["a"], root)
    stats_path = root / layout.MEMORY_STATS_YAML.format(rank=0)
    stats = yaml.safe_load(stats_path.read_text())
    for i, m in enumerate(stats.values()):  # as a CUDA run records it; the largest is the peak
        m["allocated_bytes.all.peak"] = int(40.7 * GiB) - i
    stats_path.write_text(yaml.safe_dump(stats, sort_keys=False))
    return root


LINE = "estimated 41.20 GiB per rank (batch 8, single x1), measured 40.70 GiB (allocated_bytes.all.peak, ratio 1.012)"


def test_diff_puts_the_estimate_beside_the_measured_run(real_runs, tmp_path, capsys):
    # GIVEN an estimate and a measured run of the same config
    est = _estimate_dir(tmp_path / "est")
    run = _measured_run(real_runs, tmp_path / "run")
    # WHEN diffed, either way round
    for a, b in ((est, run), (run, est / layout.MEMORY_ESTIMATE_YAML)):
        assert main(["diff", str(a), str(b)]) == 0
        # THEN one line: estimated, measured, the key and the ratio
        assert capsys.readouterr().out.strip().replace("\n", " ") == LINE


def test_report_of_a_run_with_its_estimate_prints_the_line(real_runs, tmp_path, capsys):
    run = _measured_run(real_runs, tmp_path / "run")
    _estimate_dir(run)
    assert main(["report", str(run), "--no-html"]) == 0
    assert LINE in " ".join(capsys.readouterr().out.split())


def test_report_of_an_estimate_alone(tmp_path, capsys):
    est = _estimate_dir(tmp_path / "est")
    assert main(["report", str(est)]) == 0
    assert (
        capsys.readouterr()
        .out.strip()
        .startswith("estimated 41.20 GiB per rank (batch 8, single x1), measured: no")
    )


def test_a_foreign_estimate_file_is_one_line(tmp_path, capsys):
    (tmp_path / layout.MEMORY_ESTIMATE_YAML).write_text("kind: other\n")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a memprofiler memory estimate (no `estimates`); re-run `estimate`" in err
    assert len(err.strip().splitlines()) == 1
