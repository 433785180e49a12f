"""benchmarks/overhead.py at its smoke size: every variant timed in both loops, with the right counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from memprofiler.collectors import saved_tensors

ROOT = Path(__file__).resolve().parents[1]
CPU_VARIANTS = {
    "baseline",
    "baseline_again",
    "bare_hooks",
    "outside_window",
    "inside_window",
    "torch_profiler",
}
# The window with the compiled hook reading tensors through Python: where it reads them in C++.
if not saved_tensors.NO_TENSOR_FACTS:
    CPU_VARIANTS.add("inside_window_py_tensors")
INSIDE_VARIANTS = sorted(v for v in CPU_VARIANTS if v.startswith("inside_window"))


def test_overhead_smoke_times_every_variant_in_a_loop_and_a_trainer(tmp_path):
    # GIVEN a machine without CUDA (hidden, whatever the machine has)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT / "src")}
    for key in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(key, None)
    # WHEN the benchmark runs at its smoke size
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--smoke", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # THEN it says the CUDA part is skipped, and writes one CPU record
    assert "CUDA is not available: the CUDA rows and `memory_history` are skipped" in done.stderr
    (written,) = tmp_path.iterdir()
    assert written.name.startswith("overhead_cpu_") and written.suffix == ".json"
    result = json.loads(written.read_text())["result"]
    assert result["skipped"] == ["cuda: not available"]
    # it started itself again with one arena and fixed mmap and trim thresholds
    assert result["malloc_env"] == {
        "MALLOC_ARENA_MAX": "1",
        "MALLOC_MMAP_THRESHOLD_": "33554432",
        "MALLOC_TRIM_THRESHOLD_": "17179869184",
    }
    assert result["threads"] == 1
    (repeat,) = result["repeats"]
    assert len(repeat["loadavg_before"]) == 3 and len(repeat["loadavg_after"]) == 3
    assert [(r["device"], r["blocks"], r["modules"]) for r in repeat["rows"]] == [
        ("cpu", 2, 12),
        ("cpu", 4, 22),
    ]
    for row in repeat["rows"]:
        # 10 saves per block (LayerNorm: input, mean, rstd, weight, bias; each Linear: input and
        # weight; GELU: input) and pow's input
        assert row["saved_tensors_per_call"] == 10 * row["blocks"] + 1
        for mode in ("plain", "trainer"):
            timed = row[mode]
            assert timed["timed_steps_per_variant"] == 2
            # 1 warm-up round and 2 timed: one collected call per round and window variant (one
            # profiler serves them), the window never closes
            assert timed["collected_calls_inside"] == 3 * len(INSIDE_VARIANTS)
            for clock in ("wall", "cpu"):
                figures = timed[clock]
                assert set(figures["median_step_ms"]) == CPU_VARIANTS
                assert all(v > 0 for v in figures["median_step_ms"].values())
                assert set(figures["ratio"]) == CPU_VARIANTS - {"baseline"}
                assert set(figures["paired_ratio"]) == CPU_VARIANTS - {"baseline"}
                med = figures["median_step_ms"]
                for inside in INSIDE_VARIANTS:
                    # the ratio is taken before the medians are rounded to 0.001 ms, so the two
                    # agree within what that rounding moves a quotient of short smoke steps
                    expected = med[inside] / med["bare_hooks"]
                    slack = 0.0005 * (1 + expected) / (med["bare_hooks"] - 0.0005) + 1e-4
                    assert abs(figures["ratio_to_bare_hooks"][inside] - expected) <= slack
            # the profiler's start and stop are timed apart from its steps
            assert timed["setup_teardown_ms"]["torch_profiler"] > 0
            # the collector's work inside each variant's steps is given, by generation
            assert set(timed["gc_in_step"]) == CPU_VARIANTS
            for gc_figures in timed["gc_in_step"].values():
                assert gc_figures["ms_per_step"] >= 0 and len(gc_figures["collections_by_generation"]) == 3
