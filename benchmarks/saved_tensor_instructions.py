"""Instructions per saved tensor: the saved-tensor collector against bare hooks, counted, not timed.

On a shared machine step times move by several percent between runs; instruction counts do
not. This runs the 1,002-module residual MLP of ``saved_tensor_floor.py`` (narrow: 200 blocks of
width 16, batch 4, so that the matrix products are small beside the per-tensor work) under
valgrind's callgrind, one process for every variant, forward and backward ``--steps`` times each:

* ``baseline``: no hooks;
* ``identity_hooks``: pack and unpack return the tensor;
* ``holder_hooks``: a ``_Saved`` holder per tensor, unpacked in C (what the collector stores);
* ``collector``: ``SavedTensorsCollector`` with per-module attribution, as a collected call runs it;
* ``collector_py_tensors``: the same, with the compiled hook reading each tensor through Python
  instead of from the C++ tensor (where ``memprofiler._tensor_facts`` is built);
* ``collector_previous`` (with ``--previous FILE``): another build of the compiled pack hook;
* ``window`` and ``window_without_saved_tensors`` (``--variants``): the forward in a
  ``@memprofilable`` call of a ``MemProfiler`` collecting every call, with and without saved
  tensors: what the rest of a collected call adds.

Callgrind dumps its counters each time the process calls ``getppid`` (``--dump-before``), which
the child calls between the variants, so each variant's steps are counted alone. Prints, and
with ``--out`` saves, the instructions per step and per saved tensor over ``baseline`` and over
``holder_hooks``. Needs ``valgrind``; about five minutes. Run as ``python
benchmarks/saved_tensor_instructions.py [--previous OLD.so] [--out benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

VARIANTS = (
    "baseline",
    "identity_hooks",
    "holder_hooks",
    "collector",
    "collector_py_tensors",
    "collector_previous",
)
WINDOWS = ("window", "window_without_saved_tensors")


def child(variants: list[str], depth: int, width: int, batch: int, steps: int, previous: str | None) -> None:
    import tempfile

    import torch
    from _packer_builds import PreviousCollector, previous_packer
    from overhead import INSIDE, ResMLP

    from memprofiler import MemProfiler, memprofilable
    from memprofiler.collectors import saved_tensors
    from memprofiler.collectors.saved_tensors import SavedTensorsCollector, _Saved, _unpack

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ResMLP(width, depth)
    x = torch.randn(batch, width)
    ctx: Any = SimpleNamespace(module=model, closes_window=False, fn_name="training_step", scratch={})
    colls: dict[str, Any] = {
        "collector": SavedTensorsCollector(),
        "collector_py_tensors": SavedTensorsCollector(),
    }
    if previous:
        PreviousCollector.packer = previous_packer(Path(previous))
        colls["collector_previous"] = PreviousCollector()

    def holder(t: torch.Tensor) -> _Saved:
        h = _Saved()
        h.t = t
        return h

    def same(t: torch.Tensor) -> torch.Tensor:
        return t

    class Call:
        @memprofilable
        def training_step(self, xb: torch.Tensor) -> torch.Tensor:
            return model(xb).pow(2).mean()

    call = Call()
    profs = {}
    for name, saved in (("window", True), ("window_without_saved_tensors", False)):
        if name in variants:
            cfg = {**INSIDE, "enable_saved_tensors_hooks": saved}
            profs[name] = MemProfiler(cfg, save_dir=Path(tempfile.mkdtemp()), rank=0).setup(model)

    def step(name: str) -> None:
        MemProfiler.detach(call)
        if name in profs:
            profs[name].attach(call)
            loss = call.training_step(x)
        elif name in colls:
            if name == "collector_py_tensors":
                saved_tensors.read_tensors_in_cpp(False)
            colls[name].start(ctx)
            try:
                loss = model(x).pow(2).mean()
            finally:
                colls[name].end(ctx, True)
                if name == "collector_py_tensors":
                    saved_tensors.read_tensors_in_cpp(True)
        elif name == "baseline":
            loss = model(x).pow(2).mean()
        else:
            pack, unpack = (holder, _unpack) if name == "holder_hooks" else (same, same)
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                loss = model(x).pow(2).mean()
        loss.backward()

    for name in variants:
        step(name)  # warm: lazy set-up is not counted
        step(name)
        os.getppid()  # a dump: what follows is this variant's steps alone
        for _ in range(steps):
            step(name)
        os.getppid()


def _tensors_in_cpp() -> bool:
    """Whether the compiled hook reads tensors in C++ here (else ``collector_py_tensors`` is left out)."""
    from memprofiler.collectors import saved_tensors

    return not saved_tensors.NO_TENSOR_FACTS


def _totals(files: list[Path]) -> list[int]:
    """Instructions of each dump, in the order the dumps were made."""

    def part(p: Path) -> int:  # `cg.out.N`: the N-th dump; `cg.out`: the one at exit, last
        m = re.search(r"\.(\d+)$", p.name)
        return int(m.group(1)) if m else 1 << 30

    out = []
    for f in sorted(files, key=part):
        m = re.search(r"^(?:totals|summary):\s+(\d+)", f.read_text(errors="replace"), re.M)
        out.append(int(m.group(1)) if m else 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=200)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--previous", type=Path, default=None, help="another build of memprofiler/_packer*.so"
    )
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS + WINDOWS, default=None, help="default: all but the windows"
    )
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    previous = str(args.previous.resolve()) if args.previous else None
    if args.child:
        child(args.child, args.depth, args.width, args.batch, args.steps, previous)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("saved_tensor_instructions.py: valgrind is not installed (apt-get install valgrind)")
    chosen = [
        v
        for v in args.variants or VARIANTS
        if v != "baseline"
        and (v != "collector_previous" or previous)
        and (v != "collector_py_tensors" or _tensors_in_cpp())
    ]
    variants = ["baseline", *chosen]
    work = Path(tempfile.mkdtemp(prefix="memprofiler-callgrind-"))
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--dump-before=getppid",
        f"--callgrind-out-file={work}/cg.out",
        sys.executable,
        __file__,
        "--depth",
        str(args.depth),
        "--width",
        str(args.width),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--child",
        *variants,
    ]
    if previous:
        cmd += ["--previous", previous]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "MALLOC_ARENA_MAX": "1"})
    totals = _totals(list(work.glob("cg.out*")))
    # dumps: [set-up and the first variant's warm steps], its counted steps, [the next one's warm
    # steps], its counted steps, ..., [exit]
    counted = {name: totals[1 + 2 * i] for i, name in enumerate(variants)}
    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    from _packer_builds import this_build
    from overhead import ResMLP, saved_per_call

    saved = saved_per_call(ResMLP(args.width, args.depth), torch.randn(args.batch, args.width))
    per_step = {k: v / args.steps for k, v in counted.items()}
    result = {
        "benchmark": "saved_tensor_instructions",
        "model": f"{args.depth} residual MLP blocks, width {args.width}, batch {args.batch}",
        "saved_tensors_per_step": saved,
        "steps": args.steps,
        "packer": this_build(),
        "instructions_per_step": {k: round(v) for k, v in per_step.items()},
        "per_saved_tensor_over_baseline": {
            k: round((v - per_step["baseline"]) / saved) for k, v in per_step.items() if k != "baseline"
        },
        "per_saved_tensor_over_holder_hooks": {
            k: round((v - per_step["holder_hooks"]) / saved)
            for k, v in per_step.items()
            if k.startswith(("collector", "window")) and "holder_hooks" in per_step
        },
    }
    from _emit import emit

    # with the windows, a record of its own: `saved_tensor_instructions-window_<hardware>_<date>`
    windows = any(v in WINDOWS for v in variants)
    emit(result, args.out, benchmark="saved_tensor_instructions" + ("-window" if windows else ""))


if __name__ == "__main__":
    main()
