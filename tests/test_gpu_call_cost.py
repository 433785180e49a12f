"""tools/gpu_call_cost.py: its dry run (CPU, tiny sizes, the fake allocator) times every part and
variant on both models and records them in the one result schema."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from _scripts import load_script

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gpu_call_cost.py"


def _tool():
    return load_script("tools/gpu_call_cost.py")


def test_the_dry_run_times_each_part_and_every_variant_on_both_models(tmp_path):
    tool = _tool()
    out = tmp_path / "gpu_call_cost_cpu.json"
    result = tool.main(["--dry-run", "--rounds", "1", "--steps", "2", "--calls", "5", "--out", str(out)])
    # THEN the record is the one schema, named for the GPU run it prepares
    written = json.loads(out.read_text())
    assert written["result"] == json.loads(json.dumps(result)) and written["benchmark"] == "gpu_call_cost"
    assert {"hardware", "date", "commit", "command", "machine"} <= written.keys()
    assert result["dry_run"] is True
    # AND every primitive of a collected call was timed alone
    assert set(result["parts"]) == {
        "memory_stats", "reset_peak_memory_stats", "host_rss", "host_rss_peak_begin_and_end",
        "record_function_mark_pair",
    }  # fmt: skip
    assert all(p["wall_us"] > 0 for p in result["parts"].values())
    # AND the models are the ones named, at the dry run's sizes: tiny GPT-2 (its head tied to
    # the token embedding) and 600 modules of width 8
    s = tool.TINY
    w, v, ctx = s.gpt2_width, s.gpt2_vocab, 1024
    block = 2 * w + (w * 3 * w + 3 * w) + (w * w + w) + 2 * w + (w * 4 * w + 4 * w) + (4 * w * w + w)
    gpt2 = result["models"]["gpt2"]
    assert gpt2["parameters"] == v * w + ctx * w + s.gpt2_layers * block + 2 * w
    with torch.device("meta"):  # and GPT-2 small at the GPU run's sizes, as transformers' GPT2LMHeadModel
        assert sum(p.numel() for p in tool.GPT2(tool.REAL).parameters()) == 124_439_808
    wide = result["models"]["modules600"]
    assert wide["modules"] == 600
    assert wide["parameters"] == 99 * (2 * s.width + 2 * (s.width**2 + s.width)) + 5 * (s.width**2 + s.width)
    # AND each variant ran its steps; without CUDA there is no device time
    for model in (gpt2, wide):
        assert set(model["per_step"]) == set(tool.VARIANTS)
        for row in model["per_step"].values():
            assert row["thread_cpu_us"] > 0 and row["wall_us"] > 0
            assert row["device_step_ms"] is None and row["device_idle_gap_ms"] is None
        assert set(model["shares"]) == set(tool.SHARES)
