"""The estimate for a GPU target, made on CPU, against real GPU steps; prints JSON.

The measurements (``tests/fixtures/gpu_h200/estimate_measured_h200.json``) are
``max_memory_allocated()`` and ``max_memory_reserved()`` of two real AdamW training steps on one
NVIDIA H200 with torch 2.11 and transformers 5.17; ``panel.py`` beside them builds the same
models and batches (B=8, T=512 for the language models, 16 images for ViT). For each row a
fresh child process estimates the two steps with ``estimate_memory(gpu="H200",
torch_version="2.11")`` on a CPU-only machine, the model built on the meta device.

Nothing is fitted to these rows: the workspaces come from torch 2.11's cuBLAS rules, the
attention kernel from its CUDA selection rules, the reserved figure from the allocator model.
The estimate's cuBLAS part is reported on its own, beside the workspace the measurement freed
with ``torch._C._cuda_clearCublasWorkspaces()`` (GPT-2, fp32).

T5 runs ``scaled_dot_product_attention`` with a learned position bias as the mask. Under
transformers 5.17 (the measured version) that bias is a permuted view whose last dimension has
stride 8, so the GPU sends T5's self-attention to the math path (its cross-attention, whose mask
is contiguous, to memory-efficient attention); 5.24 makes the mask contiguous, and every call
runs memory-efficient attention. ``--pythonpath`` puts the measured version first on the
children's path (``pip install --no-deps --target DIR .whl/tf517/*.whl``), so the rows are
estimated with the transformers the measurement ran; each row records the version it used.

Run (a CPU-only machine):
``PYTHONPATH=src:tests python benchmarks/estimate_gpu.py --pythonpath DIR --out benchmarks/results``
``python benchmarks/estimate_gpu.py --markdown benchmarks/results/estimate_gpu_h200_20261127.json``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit, read_result

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "gpu_h200"
MiB = 1 << 20
#: (row name, panel model, precision, attention implementation or None for the default)
ROWS = [
    ("gpt2", "gpt2", "32-true", None),
    ("bert_mlm", "bert_mlm", "32-true", None),
    ("vit", "vit", "32-true", None),
    ("llama", "llama", "32-true", None),
    ("t5", "t5", "32-true", None),
    ("gpt2", "gpt2", "bf16-mixed", None),
]


def child(name: str, precision: str, attn: str | None) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(FIXTURES))
    import panel

    from memprofiler import estimate_memory

    make_model, make_batch = panel.PANEL[name]
    torch.manual_seed(0)
    with torch.device("meta"):
        model = make_model()
    if attn is not None:
        model.config._attn_implementation = attn
        for m in model.modules():
            if hasattr(m, "config"):
                m.config._attn_implementation = attn
    model.train()
    start = time.perf_counter()
    est = estimate_memory(
        model,
        make_batch(),
        optimizer=panel.OPTIMIZERS["adamw"],
        loss_fn=panel.hf_loss,
        precision=precision,
        gpu="H200",
        torch_version="2.11",
    )
    import transformers

    return {
        "transformers": transformers.__version__,
        "estimate_allocated": est.peak_bytes,
        "estimate_reserved": est.reserved_peak_bytes,
        "estimate_tensors": est.tensor_peak_bytes,
        "workspaces": est.workspace_bytes,
        "peak_at": f"{est.peak_module} ({est.peak_phase}, step {est.peak_step})",
        "target": est.target,
        "notes": est.notes,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--child", nargs=3)
    ap.add_argument("--pythonpath", help="put this first on the children's path (the measured transformers)")
    args = ap.parse_args()
    if args.child:
        name, precision, attn = args.child
        print(json.dumps(child(name, precision, None if attn == "-" else attn)))
        return
    if args.markdown:
        print(markdown(read_result(args.markdown)))
        return
    measured = json.loads((FIXTURES / "estimate_measured_h200.json").read_text())
    by_key = {(r["name"], r["precision"]): r for r in measured["rows"]}
    env = {**os.environ, "GPU_B": "8", "GPU_T": "512", "MALLOC_ARENA_MAX": "1"}
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.pythonpath, env.get("PYTHONPATH")) if p)
    rows = []
    for label, name, precision, attn in ROWS:
        cmd = [sys.executable, __file__, "--child", name, precision, attn or "-"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        est = json.loads(done.stdout.strip().splitlines()[-1])
        meas = by_key[(name, precision)]
        rows.append(
            {
                "row": label,
                "precision": precision,
                **est,
                "measured_allocated": meas["meas_peak"],
                "measured_reserved": meas["meas_reserved"],
                "ratio_allocated": round(est["estimate_allocated"] / meas["meas_peak"], 4),
                "ratio_reserved": round(est["estimate_reserved"] / meas["meas_reserved"], 4),
            }
        )
        print(
            f"{label} {precision}: {rows[-1]['ratio_allocated']} / {rows[-1]['ratio_reserved']}",
            file=sys.stderr,
        )
    emit(
        {
            "what": "estimate (CPU-only machine, H200 target, torch 2.11 rules) / measured on an H200",
            "measured": {k: measured[k] for k in ("device", "torch", "transformers")},
            "cublas_workspace_measured": measured["cublas_workspace_bytes_after_steps"],
            "machine_note": "2-CPU VM shared with 7 other jobs; the figures are deterministic, the seconds are not",
            "rows": rows,
        },
        args.out,
    )


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "| model | precision | estimate allocated (MiB) | measured (MiB) | ratio | estimate reserved (MiB) "
        "| measured (MiB) | ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['row']} | {r['precision']} | {r['estimate_allocated'] / MiB:,.1f} | "
            f"{r['measured_allocated'] / MiB:,.1f} | {r['ratio_allocated']:.4f} | "
            f"{r['estimate_reserved'] / MiB:,.1f} | {r['measured_reserved'] / MiB:,.1f} | {r['ratio_reserved']:.4f} |"
        )
    lines += [
        "",
        "| model | precision | cuBLAS workspaces in the estimate (B) | measured (B) |",
        "| --- | --- | ---: | ---: |",
    ]
    measured_ws = data["cublas_workspace_measured"]
    for r in data["rows"]:
        ws = r["workspaces"]
        parts = " + ".join(f"{k} {v:,}" for k, v in ws.items())
        meas = f"{measured_ws['gpt2']:,}" if r["row"] == "gpt2" and r["precision"] == "32-true" else "-"
        lines.append(f"| {r['row']} | {r['precision']} | {sum(ws.values()):,} ({parts}) | {meas} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
