"""tools/gpu_call_cost.py: its dry run (CPU, tiny sizes, the fake allocator) times every part and
variant on both models and records them in the one result schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
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
        # AND each variant but torch's profiler took a step under the sync watch, which tells
        # nothing on CPU
        assert model["host_device_syncs"] == {v: None for v in tool.VARIANTS if v != "torch_profiler"}
        # AND the goal's ratios (the whole window, with memory hooks off, torch.profiler beside,
        # the A/A pair) are the quotients of the variants' median steps, by CPU time without CUDA
        ratios = model["ratios"]
        assert ratios["clock"] == "thread_cpu_us"
        for what, (a, b) in tool.RATIOS.items():
            per = model["per_step"]
            assert ratios[what] == round(per[a]["thread_cpu_us"] / per[b]["thread_cpu_us"], 4)
    # AND GPT-2 ran as bf16-mixed: float32 weights, the forward under bf16 autocast
    assert gpt2["precision"] == "bf16-mixed" and wide["precision"] == "bf16"
    model, loss_of = tool.gpt2(tool.TINY, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert loss_of(model).dtype == torch.float32  # cross-entropy runs in float32 under autocast


@pytest.mark.slow
def test_the_gpu_round_script_runs_both_checks_dry_and_writes_their_records(tmp_path):
    # GIVEN the one script a lent GPU runs, in its dry mode (CPU, smallest sizes)
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "DRY": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", str(root / "tools" / "gpu_perf_round.sh")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # THEN both checks ran and wrote their records and logs, and the pack hook it timed is named
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pack hook: compiled" in done.stdout or "pack hook: python" in done.stdout
    names = {p.name for p in tmp_path.iterdir()}
    assert {"gpu_call_cost.log", "overhead.log"} <= names
    (cost,) = [n for n in names if n.startswith("gpu_call_cost_") and n.endswith(".json")]
    (overhead,) = [n for n in names if n.startswith("overhead_") and n.endswith(".json")]
    assert json.loads((tmp_path / cost).read_text())["result"]["dry_run"] is True
    assert json.loads((tmp_path / overhead).read_text())["result"]["smoke"] is True


def test_the_sync_watch_counts_each_wait_and_names_the_frame_in_memprofiler_that_made_it(recwarn):
    tool = _tool()
    # GIVEN a function in memprofiler's package (by its code's file name) that warns as torch's
    # sync debug mode warns of an operation that waits for the device, and one outside it
    inside = tool.PACKAGE / "collectors" / "cuda_stats.py"
    code = compile(f"def waits():\n    warnings.warn({tool.SYNC_WARNING!r})\n", str(inside), "exec")
    scope = {"warnings": warnings}
    exec(code, scope)

    def elsewhere():
        warnings.warn(tool.SYNC_WARNING, stacklevel=1)

    # WHEN both are called twice under the watch, beside an unrelated warning
    with tool.SyncWatch(gpu=False) as watch:
        for _ in range(2):
            scope["waits"]()
            elsewhere()
        warnings.warn("something else", UserWarning, stacklevel=1)
    # THEN every wait is counted, once each call, and the one made in memprofiler is named by
    # its file, line and function; the unrelated warning passes through untouched
    assert watch.count == 4
    assert watch.ours == {"collectors/cuda_stats.py:2 waits"}
    assert [str(w.message) for w in recwarn] == ["something else"]
    # AND on CPU the record says nothing was measured rather than "no wait"
    assert watch.result() is None
