"""What any Python saved-tensor hook costs, beside what memprofiler's collector costs, on CPU.

The inside-window overhead of ``saved_tensors`` collection is paid per tensor autograd saves.
This separates the part no Python hook can avoid from the collector's own work, on the
residual MLPs of ``benchmarks/scaling.py`` (same FLOPs at every depth). Variants, one plain
step each (forward and loss, backward, SGD), interleaved in a new random order every round,
one shared model per depth:

* ``baseline`` / ``baseline_again``: no hooks (their ratio is the noise floor);
* ``identity_hooks``: ``saved_tensors_hooks(lambda t: t, lambda t: t)``, the cost of calling
  Python twice per saved tensor (pack in forward, unpack in backward);
* ``detach_hooks``: pack returns ``t.detach()`` (what the collector returned before: a
  fresh alias only the graph holds, so that a weak reference to it tells when the graph
  dropped it);
* ``holder_hooks``: pack returns a ``_Saved`` holder of the tensor itself and unpack is a C
  ``attrgetter``: the floor of the collector's present design (it detaches only an output
  saved by its own node);
* ``compiled_off``: the compiled pack hook switched off (as after a fault): each save pays
  the call into C, a ``detach()`` and a holder, and nothing is counted;
* ``collector``: :class:`memprofiler.collectors.saved_tensors.SavedTensorsCollector` around
  the forward, with per-module attribution, as a collected call runs it;
* ``collector_python``: the same collector with its pure-Python pack hook (what runs where
  ``memprofiler._packer`` could not be compiled, and what ``collector`` ran before it existed);
* ``collector_no_walk``: the Python collector with its stack walk to the running module replaced
  by a constant label: what attribution costs is the difference;
* ``collector_previous`` (with ``--previous FILE``): the collector with another build of the
  compiled pack hook (``_packer*.so`` of an earlier commit), side by side with this one.

Besides the step, the forward alone is timed (``median_forward_cpu_ms``): the pack hooks run
there, the unpack in backward.

Prints one JSON object: median main-thread CPU time per step and ratios to ``baseline``.
Run as ``MALLOC_ARENA_MAX=1 python benchmarks/saved_tensor_floor.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _emit import emit
from _packer_builds import PreviousCollector, previous_packer, this_build
from overhead import ResMLP
from scaling import _saved_count, width_for

from memprofiler.collectors.module_tracker import OUTSIDE_NAME
from memprofiler.collectors.saved_tensors import SavedTensorsCollector, _Saved, _unpack

VARIANTS = (
    "baseline",
    "baseline_again",
    "identity_hooks",
    "detach_hooks",
    "holder_hooks",
    "compiled_off",
    "collector",
    "collector_python",
    "collector_no_walk",
    "collector_previous",
)


class _NoWalk(SavedTensorsCollector):
    def _owner(self, frame: Any) -> str:
        return OUTSIDE_NAME


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _detach(t: torch.Tensor) -> torch.Tensor:
    return t.detach()


def _holder(t: torch.Tensor) -> _Saved:
    h = _Saved()
    h.t = t
    return h


def one_depth(
    depth: int,
    base_width: int,
    batch: int,
    rounds: int,
    warmup: int,
    variants: tuple[str, ...] = VARIANTS,
    previous: type[Any] | None = None,
) -> dict[str, Any]:
    torch.manual_seed(0)
    width = width_for(depth, base_width)
    model = ResMLP(width, depth)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)
    colls = {
        "collector": SavedTensorsCollector(),
        "collector_python": SavedTensorsCollector(compiled=False),
        "collector_no_walk": _NoWalk(compiled=False),
    }
    if previous is not None:
        PreviousCollector.packer = previous
        colls["collector_previous"] = PreviousCollector()
    off = SavedTensorsCollector()._p  # a packer not started: switched off
    ctx: Any = SimpleNamespace(module=model, closes_window=False, fn_name="training_step", scratch={})

    def forward(name: str) -> torch.Tensor:
        if name in ("baseline", "baseline_again"):
            return model(x).pow(2).mean()
        if name in colls:
            coll = colls[name]
            coll.start(ctx)
            try:
                return model(x).pow(2).mean()
            finally:
                coll.end(ctx, True)
        if name == "compiled_off":
            with torch.autograd.graph.saved_tensors_hooks(off.pack, _unpack):
                return model(x).pow(2).mean()
        if name == "holder_hooks":
            with torch.autograd.graph.saved_tensors_hooks(_holder, _unpack):
                return model(x).pow(2).mean()
        pack: Callable[[torch.Tensor], torch.Tensor] = _identity if name == "identity_hooks" else _detach
        with torch.autograd.graph.saved_tensors_hooks(pack, _identity):
            return model(x).pow(2).mean()

    times: dict[str, list[float]] = {k: [] for k in variants}
    fwd: dict[str, list[float]] = {k: [] for k in variants}
    rng = random.Random(depth)
    for r in range(warmup + rounds):
        for name in rng.sample(variants, len(variants)):
            c0 = time.thread_time()
            loss = forward(name)
            c1 = time.thread_time()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if r >= warmup:
                times[name].append(time.thread_time() - c0)
                fwd[name].append(c1 - c0)
    med = {k: statistics.median(v) for k, v in times.items()}
    p10 = {k: statistics.quantiles(v, n=10)[0] for k, v in times.items()}
    saved = _saved_count(model, batch, width)
    out = {
        "blocks": depth,
        "width": width,
        "modules": sum(1 for _ in model.modules()),
        "saved_tensors_per_call": saved,
        "timed_steps_per_variant": rounds,
        "median_step_cpu_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "median_forward_cpu_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in fwd.items()},
        "ratio": {k: round(v / med["baseline"], 4) for k, v in med.items() if k != "baseline"},
        # The 10th percentile: steps a busy host slowed least (this VM's steal time moves medians).
        "ratio_p10": {k: round(v / p10["baseline"], 4) for k, v in p10.items() if k != "baseline"},
    }
    if "holder_hooks" in med:
        # The goal's figure: a collector's step over the bare hooks' step (the floor).
        out["ratio_to_holder_hooks"] = {
            k: round(v / med["holder_hooks"], 4) for k, v in med.items() if k.startswith("collector")
        }
    # Per saved tensor, over the baseline: what each collector variant costs.
    out["us_per_saved_tensor"] = {
        k: round((med[k] - med["baseline"]) * 1e6 / saved, 2) for k in med if k.startswith("collector")
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[24, 200])
    parser.add_argument("--base-width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="fewer variants make shorter rounds: less host noise between them (baseline is always in)",
    )
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="another build of memprofiler/_packer*.so, timed as `collector_previous`",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    previous = previous_packer(args.previous) if args.previous is not None else None
    chosen = [v for v in args.variants if v != "collector_previous" or previous is not None]
    variants = tuple(dict.fromkeys(["baseline", *chosen]))
    load = [os.getloadavg()]
    sizes = [
        one_depth(d, args.base_width, args.batch, args.rounds, args.warmup, variants, previous)
        for d in args.depths
    ]
    load.append(os.getloadavg())
    emit(
        {
            "benchmark": "saved_tensor_floor",
            "sizes": sizes,
            "threads": torch.get_num_threads(),
            "packer": this_build(),
            "loadavg_1_5_15_before_after": [[round(x, 2) for x in la] for la in load],
        },
        args.out,
    )


if __name__ == "__main__":
    main()
