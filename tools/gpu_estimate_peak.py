"""Which tensors explain the estimate's gap at the peak: a real CUDA run against the estimate, op by op.

For each panel model (``tests/fixtures/gpu_h200/panel.py``; a spec is
``name[:attention][%precision]``, the default :data:`DEFAULT_MODELS`: ``rmsnorm_lm`` in float32
and bf16-mixed, LLaMA, ViT and T5 in bf16-mixed, GPT-2 as a control), in a child process of its own:

1. the real run, as ``estimate_measured_h200.json`` was measured (model built under
   ``torch.device("cuda")``, the batch moved there, AdamW lr 1e-4, two steps of forward, loss,
   backward, ``step()``, ``zero_grad()``; ``bf16-mixed``: forward and loss under CUDA autocast,
   as Lightning runs them): first untagged (its step peaks are the measurement's),
   then, everything freed, again with the allocator's history on and every aten op tagged: a
   dispatch mode names the op, the module (torch's ``ModTracker``) and forward or backward, sets
   the call's index as the allocations' user metadata and reads the exact
   ``max_memory_allocated()`` of the call (peak stats reset before each op);
2. the estimate of the same steps (``estimate_memory``, this GPU's rules and torch release), its
   dispatch and allocator replay patched to log the same events under the same labels;
3. for each step, on both sides: the op call where ``allocated`` peaks and, inside it, the moment
   of the largest sum of live blocks (each rounded to 512 B: the history gives requested sizes);
   the blocks live then, grouped by ``op [bw] @module`` (``:: workspace`` for a block an op
   allocated and kept without returning it, ``:: scratch`` for one it freed before returning),
   diffed largest first; also by op and by module, each side inside the other's peak call, the
   modules where the gap between the peaks inside their forward/backward changes most, and the
   real blocks by their innermost transformers/torch.nn frame;
4. the estimate's allocator model on the tagged run's own trace (``gpu_probe/alloc_check.py``,
   ``estimate/allocator_trace.py``): the trace rewound to its first entry and replayed through the
   model (how often it chose the real source, address and block size; the allocated and reserved
   figures after every entry), and per step, at the real peak: the live blocks made before the
   steps (the build on the GPU, the batch) and during them, with their slack (block size minus
   the 512 B-rounded request, summed; the estimate's own slack at its step peaks beside it), and
   the same requests replayed from an empty cache, from the trace's start and from step 1's
   marker (the blocks live then requested first): where the real step peak differs from the
   latter, the cache the steps began with moved it by that much (the steps' reserved peak too).
   A trace it cannot check (expandable segments, one that does not rewind) is one line under
   ``errors``.

Writes ``<model>.json`` and ``<model>.txt`` per model and ``summary.json`` under ``--out`` (default
``$OUT``, else ``./gpu_probe_out``), a few KB each; for ``--keep-trace``'s models (rmsnorm_lm%bf16-mixed, llama%bf16-mixed)
the tagged run's allocator trace without frames, with the calls' labels, as
``<model>_trace.pickle`` (``tools/allocator_check.py`` reads it); the whole snapshot only with
``--keep-snapshot``. ``gpu_estimate_peak.sh`` also packs it all into ``$OUT/probe.tgz``, one file to copy off the
machine. ``--cpu-dry-run`` runs everything but the CUDA calls on CPU: the real run
is a CPU run whose synthetic history logs each op's new storages (small GPU_B / GPU_T), their
blocks and segments placed by the allocator model (so step 4 runs, and matches at every rate).

    PYTHONPATH=src:tests python tools/gpu_estimate_peak.py                 # on the GPU machine
    PYTHONPATH=src:tests python tools/gpu_estimate_peak.py --cpu-dry-run --models vit,t5:eager
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_probe, also where this is imported
from gpu_probe.alloc_check import allocator_figures, kept_trace
from gpu_probe.compare import Side, compare
from gpu_probe.estimate_log import estimate_run
from gpu_probe.history import gap_jumps, initial_live, label_by_outputs, module_peaks
from gpu_probe.real import PANEL_DIR, load_panel, real_run
from gpu_probe.report import allocator_summary, headline, render

#: What a run on a GPU should answer next (the fp32 rows are settled): nn.RMSNorm's fused
#: kernel (``rmsnorm_lm``, fp32 and bf16-mixed), and bf16-mixed on LLaMA (grouped-query flash
#: attention), ViT and T5; GPT-2 fp32 as the control, exact to 0.14% on the H200.
DEFAULT_MODELS = (
    "rmsnorm_lm",
    "rmsnorm_lm%bf16-mixed",
    "llama%bf16-mixed",
    "vit%bf16-mixed",
    "t5%bf16-mixed",
    "gpt2",
)


def fixture_peaks(name: str, precision: str = "32-true") -> list[int] | None:
    """The measured step peaks for this model, where the batch is the measured one (B=8, T=512);
    which attention the measured T5 ran is not recorded, so every t5 row is compared."""
    if (os.environ.get("GPU_B"), os.environ.get("GPU_T")) != ("8", "512"):
        return None
    data = json.loads((PANEL_DIR / "estimate_measured_h200.json").read_text())
    for row in data["rows"]:
        if row["name"] == name and row["precision"] == precision:
            return list(row["step_peaks"])
    return None


def tag_of(spec: str) -> str:
    """``t5:eager@alt`` -> ``t5_eager_alt`` (``@alt``: run with ``--also-with``'s packages first),
    ``llama%bf16-mixed`` -> ``llama_bf16-mixed``."""
    return spec.replace(":", "_").replace("@", "_").replace("%", "_")


def parse_spec(spec: str) -> tuple[str, str | None, str]:
    """``name[:attention][%precision][@alt]`` -> (name, attention or None, precision)."""
    base, _, precision = spec.split("@", 1)[0].partition("%")
    name, _, attn = base.partition(":")
    return name, attn or None, precision or "32-true"


def child(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(os.environ.get("PROBE_THREADS", "4")))
    name, attn, precision = parse_spec(spec)
    out = Path(args.out)
    cuda = not args.cpu_dry_run and torch.cuda.is_available()
    result: dict[str, Any] = {
        "model": spec,
        "precision": precision,
        "stage": "start",
        "dry_run": not cuda,
        "device": torch.cuda.get_device_name() if cuda else "cpu (dry run: the real side is a CPU run)",
        "torch": torch.__version__,
        "B": os.environ.get("GPU_B"),
        "T": os.environ.get("GPU_T"),
    }

    def save() -> None:
        (out / f"{tag_of(spec)}.json").write_text(json.dumps(result, separators=(",", ":"), default=str))

    def stage(name: str, work: Callable[[], Any]) -> Any:
        """Run one part; a failure is written down and the next part still runs where it can."""
        t0 = time.perf_counter()
        try:
            return work()
        except Exception as err:  # the parent reports it; the other parts and models go on
            result.setdefault("error", f"{name}: {type(err).__name__}: {err}")
            result.setdefault("tracebacks", {})[name] = traceback.format_exc()[-3000:]
            return None
        finally:
            result.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
            save()

    def versions() -> Any:
        import transformers

        result["transformers"] = transformers.__version__
        return load_panel()

    panel = stage("import", versions)
    if panel is None:
        return result
    real = stage("real", lambda: real_run(panel, name, attn, cuda, args.max_entries, precision))
    if real is not None:
        result["real"] = {**real["info"], "fixture_step_peaks": fixture_peaks(name, precision)}
        if args.keep_snapshot:
            with open(out / f"{tag_of(spec)}_snapshot.pickle", "wb") as f:
                pickle.dump(real["snapshot"], f)

        def allocator() -> dict[str, Any]:
            fig = allocator_figures(real["snapshot"], real["events"], real["device"])
            peaks = real["info"]["step_peaks"]  # the backend's max_memory_allocated() per step
            for s in fig.get("steps", []):
                s["max_memory_allocated"] = peaks[s["step"] - 1][0] if s["step"] <= len(peaks) else None
            return fig

        result["allocator"] = stage("allocator", allocator)
        if spec in args.keep_trace.split(","):

            def keep() -> None:
                kept = kept_trace(real["snapshot"], real["device"], real["calls"])
                with open(out / f"{tag_of(spec)}_trace.pickle", "wb") as f:
                    pickle.dump(kept, f, protocol=4)

            stage("keep_trace", keep)
    gpu = args.gpu or (None if cuda else "H200")
    version = args.torch_version or (None if cuda else "2.11")  # the dry run models the measured torch
    est = stage(
        "estimate", lambda: estimate_run(panel, name, attn, gpu, args.estimate_device, version, precision)
    )
    if est is not None:
        result["estimate"] = est["info"]
    if real is not None and est is not None:

        def analysis() -> None:
            snap, events = real["snapshot"], real["events"]
            if not result["real"].get("events_with_metadata"):
                label_by_outputs(events, real["calls"])
                result["real"]["labels"] = "by output addresses (no user metadata in the history)"
            real_side = Side(events, real["calls"], initial_live(snap, events))
            result["steps"] = compare(real_side, Side(est["events"], est["calls"], {}), args.top)
            result["gap_jumps"] = gap_jumps(module_peaks(real["calls"]), module_peaks(est["calls"]), 15)

        stage("analysis", analysis)
    result["stage"] = "done" if "error" not in result else "failed"
    save()
    text = render(result)
    (out / f"{tag_of(spec)}.txt").write_text(text + "\n")
    return result


def run_child(spec: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", spec, "--out", str(args.out), "--top", str(args.top)]
    cmd += ["--max-entries", str(args.max_entries), "--estimate-device", args.estimate_device]
    cmd += ["--keep-trace", args.keep_trace]
    cmd += ["--cpu-dry-run"] * args.cpu_dry_run + ["--keep-snapshot"] * args.keep_snapshot
    cmd += ["--gpu", args.gpu] if args.gpu else []
    cmd += ["--torch-version", args.torch_version] if args.torch_version else []
    t0 = time.perf_counter()
    path = Path(args.out) / f"{tag_of(spec)}.json"
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        rc, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        rc, err = -1, f"timed out after {args.timeout} s\n{tail}"
    seconds = round(time.perf_counter() - t0, 1)
    result: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"model": spec}
    if rc != 0 or result.get("stage") != "done":
        result.setdefault("error", f"child exit {rc}")
        result["stderr_tail"] = err[-2000:]
        path.write_text(json.dumps(result, separators=(",", ":"), default=str))
        (Path(args.out) / f"{tag_of(spec)}.txt").write_text(render(result) + "\n")
    result["wall_seconds"] = seconds
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="panel names; :attention sets one, %%precision (bf16-mixed, bf16-true) another precision",
    )
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_probe_out")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "0") or 0))
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("PROBE_TIMEOUT", "150")))
    ap.add_argument("--top", type=int, default=16, help="rows per diff")
    ap.add_argument("--max-entries", type=int, default=2_000_000, help="allocator history entries")
    ap.add_argument("--gpu", default=None, help="the estimate's target (default: this GPU; dry run: H200)")
    ap.add_argument("--torch-version", help="the estimate's torch release (default: this one; dry run: 2.11)")
    ap.add_argument("--estimate-device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--cpu-dry-run", action="store_true", help="no CUDA: a CPU run stands for the real one")
    ap.add_argument("--brief", action="store_true", help="print the headlines only (the texts are in --out)")
    ap.add_argument("--keep-snapshot", action="store_true", help="also write the snapshot pickles (MBs)")
    ap.add_argument(
        "--keep-trace",
        default="rmsnorm_lm%bf16-mixed,llama%bf16-mixed",
        help="models whose allocator trace to keep, without frames (<model>_trace.pickle, for allocator_check.py)",
    )
    ap.add_argument("--also-with", help="a site directory (e.g. another transformers) for --also-models")
    ap.add_argument("--also-models", default="vit,t5,t5:eager", help="models to run again with --also-with")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child, args)
        return 0
    b, t = ("2", "64") if args.cpu_dry_run else ("8", "512")
    env = {**os.environ, "GPU_B": os.environ.get("GPU_B", b), "GPU_T": os.environ.get("GPU_T", t)}
    env.setdefault("MALLOC_ARENA_MAX", "1")
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)  # the measurement ran with torch's default
    specs = [s.strip() for s in args.models.split(",") if s.strip()]
    jobs = [(s, env) for s in specs]
    if args.also_with:  # the same models again, another transformers (or torch) first on the path
        alt = {**env, "PYTHONPATH": os.pathsep.join([args.also_with, env.get("PYTHONPATH", "")])}
        jobs += [(f"{s.strip()}@alt", alt) for s in args.also_models.split(",") if s.strip()]
    specs = [s for s, _ in jobs]
    workers = args.workers or (1 if args.cpu_dry_run else len(jobs))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, workers)) as pool:
        results = list(pool.map(lambda job: run_child(job[0], args, job[1]), jobs))
    summary = []
    for spec, res in zip(specs, results, strict=True):
        if not args.brief:
            print((Path(args.out) / f"{tag_of(spec)}.txt").read_text())
        steps = res.get("steps") or []
        summary.append(
            {
                "model": spec,
                "stage": res.get("stage"),
                "error": res.get("error"),
                "real_step_peaks": [p[0] for p in res.get("real", {}).get("step_peaks", [])],
                "fixture_step_peaks": res.get("real", {}).get("fixture_step_peaks"),
                "estimate_step_peaks": res.get("estimate", {}).get("step_peaks"),
                "delta_rounded_by_step": [s["delta_rounded"] for s in steps],
                "estimate_slack_by_step": res.get("estimate", {}).get("slack_at_step_peaks"),
                "allocator": allocator_summary(res.get("allocator") or {}),
                "seconds": {"wall": res.get("wall_seconds"), **(res.get("seconds") or {})},
            }
        )
    total = round(time.perf_counter() - t0, 1)
    (Path(args.out) / "summary.json").write_text(
        json.dumps({"total_seconds": total, "rows": summary}, indent=1)
    )
    print("== headlines (real - estimate at each side's peak; details in <model>.txt)")
    print("   allocator: source/address/block/allocated/reserved rates; real - est = cache (real - its")
    print("   requests from an empty cache at step 1) + requests; slack (of build blocks) vs the estimate's")
    for res in results:
        print(headline(res))
    print(f"== {len(specs)} models in {total} s (workers {workers}); JSON and text under {args.out}")
    for row in summary:
        print(f"   {row['model']}: {row['stage']} {row['seconds']} {row['error'] or ''}")
    return 0 if all(r["stage"] == "done" for r in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
