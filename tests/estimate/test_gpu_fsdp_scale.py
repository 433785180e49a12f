"""tools/gpu_fsdp_scale.py: its CPU dry run (fake process group, tiny Llama) gives rank 0's shard."""

from __future__ import annotations

import json
import math
from pathlib import Path

from _scripts import load_script

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_fsdp_scale.py"


def _tool():
    return load_script("tools/gpu_fsdp_scale.py")


def test_the_cpu_dry_run_holds_rank_0s_share_of_every_parameter(tmp_path):
    tool = _tool()
    out = tmp_path / "fsdp_scale_cpu.json"
    result = tool.main(["--cpu-dry-run", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["result"] == result and written["benchmark"] == "fsdp_scale"
    assert {"hardware", "date", "commit", "command", "machine"} <= written.keys()
    s = tool.TINY
    shapes = [(s.vocab, s.dim), (s.dim,), (s.vocab, s.dim)]  # embedding, final norm, output
    head = s.dim // s.heads
    block = {
        "attention_norm": (s.dim,),
        "ffn_norm": (s.dim,),
        "wq": (s.heads * head, s.dim),
        "wk": (s.kv_heads * head, s.dim),
        "wv": (s.kv_heads * head, s.dim),
        "wo": (s.dim, s.heads * head),
        "w1": (s.ffn, s.dim),
        "w3": (s.ffn, s.dim),
        "w2": (s.dim, s.ffn),
    }
    params = shapes + [shape for _ in range(s.layers) for shape in block.values()]
    by_plan = {(r["plan"], r["world_size"]): r for r in result["rows"]}
    # FSDP2: rank 0 holds ceil(dim 0 / ranks) rows of every fp32 parameter
    for ws in (2, 4):
        want = sum(math.ceil(p[0] / ws) * math.prod(p[1:]) * 4 for p in params)
        assert by_plan[("fsdp", ws)]["param_bytes_rank0"] == want
    # TP=2: column-wise q/k/v/w1/w3 split their rows, row-wise o/w2 their columns; the rest whole
    split = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "wo": 1, "w2": 1}
    tp = sum(math.prod(p) * 4 for p in shapes) + s.layers * sum(
        math.prod(shape) * 4 // (2 if name in split else 1) for name, shape in block.items()
    )
    assert by_plan[("tp", 2)]["param_bytes_rank0"] == tp
    # every step measured something: the parameters at least
    for row in result["rows"]:
        assert all(step["max_live_tensor_bytes"] >= row["param_bytes_rank0"] for step in row["steps"])
