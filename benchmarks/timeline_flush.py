"""The memory trace's writer against an earlier revision's, side by side in one process.

Loads ``src/memprofiler/output/timeline.py`` as it was at ``--base`` (``git show``) beside the
current one and times, interleaved in a new random order every round with an A/A pair of the
base: one flush render of 10 calls (20 marks of 7 counters), ``events()`` over 300 of 500+ calls
(what a merged profiler trace reads once per cycle), a whole ``to_json`` and a flush ``dump``
appending 10 calls to its own file. Process CPU microseconds, medians over rounds; prints JSON
ratios (current / base, and base-again / base as the noise floor).

``MALLOC_ARENA_MAX=1 PYTHONPATH=src:tests python benchmarks/timeline_flush.py --base cbeaa4c [--out FILE]``
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit

ROOT = Path(__file__).resolve().parents[1]
METRICS = {
    "rss": 123456789,
    "rss_peak": 223456789,
    "allocated_bytes.all.current": 3 << 20,
    "reserved_bytes.all.current": 8 << 20,
    "allocated_bytes.all.peak": 5 << 20,
    "reserved_bytes.all.peak": 10 << 20,
    "saved_tensors.unique_bytes": 4096,
}
T0 = 1_700_000_000_123_456_789
CALLS_PER_FLUSH = 10


def _base_module(rev: str, tmp: Path) -> Any:
    text = subprocess.run(
        ["git", "show", f"{rev}:src/memprofiler/output/timeline.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = tmp / "timeline_base.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("memprofiler.output._timeline_base", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _feed(tl: Any, first: int, n: int) -> None:
    from memprofiler.output.events import SnapshotEvent

    for call in range(first, first + n):
        for phase in ("start", "end"):
            t = T0 + call * 1_000_000 + (400_000 if phase == "end" else 0)
            tl.on_snapshot(
                SnapshotEvent(f"0.training_step.{call}.{phase}", 0, "training_step", call, phase, t, METRICS)
            )


def _render(mod: Any, tl: Any, marks: list[Any]) -> str:
    # the base had a module-level builder; the current one a method
    if hasattr(mod, "_events_json"):
        return str(mod._events_json(marks, tl.rank, tl._base_ns(), {}))
    return str(tl._events_json(marks, tl.rank, tl._base_ns(), {}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="cbeaa4c")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from memprofiler.output import timeline as current

    tmp = Path(tempfile.mkdtemp())
    base = _base_module(args.base, tmp)
    mods = {"base": base, "base_again": base, "current": current}
    tls = {k: m.MemoryTimeline(0) for k, m in mods.items()}
    for tl in tls.values():
        _feed(tl, 1, 500)
    marks = {k: tl._marks[: 2 * CALLS_PER_FLUSH] for k, tl in tls.items()}
    assert _render(base, tls["base"], marks["base"]) == _render(current, tls["current"], marks["current"])
    res: dict[str, dict[str, list[float]]] = {
        k: {"render": [], "events": [], "to_json": [], "dump": []} for k in tls
    }
    dirs = {k: tmp / k for k in tls}
    for d in dirs.values():
        d.mkdir()
    nxt = 501
    gc.disable()
    for _ in range(args.rounds):
        order = list(tls)
        random.shuffle(order)
        for k in order:
            tl = tls[k]
            gc.collect()
            t = time.process_time_ns()
            for _ in range(200):
                _render(mods[k], tl, marks[k])
            res[k]["render"].append((time.process_time_ns() - t) / 200 / 1e3)
            gc.collect()
            t = time.process_time_ns()
            for _ in range(3):
                tl.events(77, T0, T0, T0 + 300 * 1_000_000)
            res[k]["events"].append((time.process_time_ns() - t) / 3 / 1e3)
            gc.collect()
            t = time.process_time_ns()
            for _ in range(3):
                tl._rendered_base = None
                tl.to_json()
            res[k]["to_json"].append((time.process_time_ns() - t) / 3 / 1e3)
        order = list(tls)
        random.shuffle(order)
        for k in order:
            _feed(tls[k], nxt, CALLS_PER_FLUSH)
            gc.collect()
            t = time.process_time_ns()
            tls[k].dump(str(dirs[k]))
            res[k]["dump"].append((time.process_time_ns() - t) / 1e3)
        nxt += CALLS_PER_FLUSH
    for d in dirs.values():  # every variant wrote a valid trace
        json.loads((d / "memory_trace_rank_0.json").read_text())
    med = {k: {m: round(statistics.median(v), 1) for m, v in r.items()} for k, r in res.items()}
    emit(
        {
            "what": "memory trace writer: current vs --base, process CPU microseconds (medians over rounds)",
            "base": args.base,
            "medians_us": med,
            "ratio_current_over_base": {
                m: round(med["current"][m] / med["base"][m], 3) for m in med["current"]
            },
            "ratio_aa": {m: round(med["base_again"][m] / med["base"][m], 3) for m in med["current"]},
            "sizes": f"{CALLS_PER_FLUSH} calls (20 marks, 7 counters) per flush and render; events() over 300 of "
            "500+ calls; to_json over all",
            "rounds": args.rounds,
            "machine_note": "2 CPU cores shared with other jobs",
        },
        args.out,
    )


if __name__ == "__main__":
    main()
