"""MemProfiler in a Fabric loop: the wrapped module's parameters are still excluded."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import load_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from fabric_loop import main


def test_fabric_loop_collects_calls_two_and_three(tmp_path):
    prof = main(str(tmp_path), steps=4)
    stats = load_stats(tmp_path)
    assert list(stats) == [f"0.train_step.{c}.{p}" for c in (2, 3) for p in ("start", "end")]
    # x (32x64), the ReLU output (32x256, saved by ReLU and the second Linear) and the output
    # saved by pow (32x8); Fabric's wrapper around the module changes nothing
    assert stats["0.train_step.3.end"]["saved_tensors.unique_bytes"] == 4 * 32 * (64 + 256 + 8)
    assert prof.call_count("train_step") == 4
