"""The estimate's allocator model on the real run's own trace, and what the cache the steps began
with did to their peaks (``memprofiler.estimate.allocator.trace``).

- ``check``: the trace rewound to its first entry and replayed through the model (match rates,
  peaks, the slack at the real peak on both sides);
- per step, at the real peak (the first entry of the step's largest ``allocated_bytes``): the
  live blocks made before the steps began (the model's build, the batch) and during them, with
  their bytes and slack (block size minus the 512 B-rounded request);
- ``clean``: the same requests from an empty cache, once from the trace's start (the build
  included) and once from step 1's marker (the blocks live then requested first, in address
  order, as an estimate places the parameters): where the real step peak differs from the
  second, the cache state the steps began with moved it by that much (the replays are the
  model's: where its match rates are below 1, that difference holds its departures too).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from memprofiler.estimate.allocator.caching import round_size
from memprofiler.estimate.allocator.trace import (
    ALLOCATED,
    RewindError,
    Rewound,
    check_trace,
    clean_replay,
    config_from_settings,
    rewind,
)

from .history import Event, step_windows


def _live_at(
    back: Rewound, trace: Sequence[Event], entries: set[int]
) -> dict[int, list[tuple[int, int, int]]]:
    """Allocated blocks (not pending a free) after each of ``entries``: (the entry that allocated
    it, -1 before the trace; block size; requested bytes)."""
    live = {
        b.address: (-1, b.size, b.requested) for g in back.segments for b in g.blocks if b.state == ALLOCATED
    }
    out: dict[int, list[tuple[int, int, int]]] = {}
    for i, e in enumerate(trace):
        action, addr = e.get("action"), int(e.get("addr", 0))
        if action == "alloc":
            live[addr] = (i, back.block_size[i], int(e["size"]))
        elif action == "free_requested":
            live.pop(addr, None)
        elif action == "free_completed":
            live.pop(addr, None)  # freed with no request before it (allocated drops now)
        if i in entries:
            out[i] = list(live.values())
    return out


def _part(blocks: Sequence[tuple[int, int, int]], config: Any) -> dict[str, int]:
    return {
        "bytes": sum(size for _, size, _ in blocks),
        "blocks": len(blocks),
        "slack": sum(size - round_size(req, config) for _, size, req in blocks),
    }


def allocator_figures(
    snapshot: Mapping[str, Any], events: Sequence[Event], device: int = 0, keep: int = 3
) -> dict[str, Any]:
    """The figures above; a part that cannot be had (a trace the rewind refuses, expandable
    segments) is one line under ``errors`` and the rest still comes."""
    t0 = time.perf_counter()
    config = config_from_settings(snapshot.get("allocator_settings"))
    out: dict[str, Any] = {"entries": len(events), "config": config.describe(), "errors": []}
    try:
        back = rewind(snapshot, device)
    except Exception as err:  # RewindError: the trace and the dumped state disagree
        out["errors"].append(
            f"rewind: {err}" if isinstance(err, RewindError) else f"rewind: {type(err).__name__}: {err}"
        )
        return out
    windows = step_windows(events)
    first = min((lo for lo, _ in windows.values()), default=len(events))
    out["guessed_block_sizes"] = back.guessed
    out["live_before_trace"] = sum(1 for g in back.segments for b in g.blocks if b.state != "free")
    try:
        check = check_trace(snapshot, device, config, keep=keep)
        figures = asdict(check)
        out["divergences"] = figures.pop("divergences")
        out["rates"] = check.rates()
        out["check"] = figures
    except Exception as err:  # a trace the model cannot follow: said, and the rest still comes
        out["errors"].append(f"check: {type(err).__name__}: {err}")
    peaks = {}
    for step, (lo, hi) in sorted(windows.items()):
        span = back.allocated_after[lo:hi]
        if span:
            peaks[step] = lo + span.index(max(span))
    live = _live_at(back, events, set(peaks.values()))
    steps: list[dict[str, Any]] = []
    spans = [windows[step] for step in peaks]
    for step, at in peaks.items():
        before = [b for b in live[at] if b[0] < first]
        during = [b for b in live[at] if b[0] >= first]
        steps.append(
            {
                "step": step,
                "entry": at,
                "real_peak": back.allocated_after[at],
                "real_slack": _part(live[at], config)["slack"],
                "before_steps": _part(before, config),
                "during_steps": _part(during, config),
            }
        )
    out["steps"] = steps
    out["real_reserved_in_steps"] = max(back.reserved_after[first:], default=0)
    try:
        whole = clean_replay(snapshot, device, config, windows=spans)
        out["clean_from_start"] = asdict(whole)
        if steps:  # no step marker in the trace: nothing to cut it at
            cut = {**snapshot, "device_traces": _cut(snapshot, device, first)}
            steps_only = clean_replay(
                cut, device, config, windows=[(lo - first, hi - first) for lo, hi in spans]
            )
            out["clean_from_step1"] = asdict(steps_only)
            for s, a, b in zip(steps, whole.windows, steps_only.windows, strict=True):
                s["clean_from_start_peak"], s["clean_from_start_slack"] = a
                s["clean_from_step1_peak"], s["clean_from_step1_slack"] = b
    except Exception as err:
        out["errors"].append(f"clean replay: {type(err).__name__}: {err}")
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


#: what a kept trace entry holds (the frames, most of a snapshot's bytes, are dropped)
TRACE_KEYS = ("action", "addr", "size", "stream", "user_metadata")


def kept_trace(snapshot: Mapping[str, Any], device: int, calls: Sequence[Any]) -> dict[str, Any]:
    """The snapshot without frames, for ``tools/allocator_check.py`` and later replays: its
    segments and ``device``'s trace (as device 0), the allocator settings, and ``probe_calls``:
    the label of each tagged call, which an entry's ``user_metadata`` indexes."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    segments = []
    for g in snapshot.get("segments", []):
        if int(g.get("device", 0)) != device:
            continue
        blocks = [
            {k: b[k] for k in ("address", "size", "requested_size", "state") if k in b} for b in g["blocks"]
        ]
        segments.append(
            {**{k: v for k, v in g.items() if k not in ("blocks", "frames")}, "device": 0, "blocks": blocks}
        )
    return {
        "segments": segments,
        "device_traces": [[{k: e[k] for k in TRACE_KEYS if k in e} for e in trace]],
        "allocator_settings": snapshot.get("allocator_settings"),
        "probe_calls": [[c.step, c.label] for c in calls],
    }


def _cut(snapshot: Mapping[str, Any], device: int, start: int) -> list[Any]:
    traces = list(snapshot.get("device_traces") or [])
    traces[device] = list(traces[device])[start:]
    return traces


def summary_line(
    fig: Mapping[str, Any],
    est_peaks: Sequence[int] | None = None,
    est_slack: Sequence[int] | None = None,
    est_reserved: int | None = None,
) -> str:
    """One line for the headlines: the match rates (source/address/block/allocated/reserved: how
    often the model decided as the real allocator did), and per step the real peak against the same
    requests from an empty cache at step 1; with the estimate's step peaks, real - estimate split
    into the cache the steps began with (real - that replay) and the requests (that replay -
    estimate); the slack at the real peak (of it in blocks made before the steps) and the estimate's;
    the reserved peak of the steps split the same way."""
    if not fig:
        return "allocator: not checked"
    parts = []
    rates = fig.get("rates")
    if rates:
        keys = ("source", "address", "block_size", "allocated", "reserved")
        parts.append("rates " + "/".join(f"{rates[k]:g}" for k in keys))
    for s in fig.get("steps", []):
        n, real, clean = s["step"], s["real_peak"], s.get("clean_from_step1_peak")
        est = est_peaks[n - 1] if est_peaks and len(est_peaks) >= n else None
        if clean is None:
            head = f"s{n} real {real:,} (no clean replay)"
        elif est is None:
            head = f"s{n} real {real:,} vs clean@step1 {clean:,} ({real - clean:+,})"
        else:
            head = f"s{n} {real - est:+,} = cache {real - clean:+,} + requests {clean - est:+,}"
        slack = f"slack {s['real_slack']:,} (build {s['before_steps']['slack']:,})"
        if est_slack and len(est_slack) >= n:
            slack += f" vs est {est_slack[n - 1]:,}"
        parts.append(f"{head}, {slack}")
    clean_res = (fig.get("clean_from_step1") or {}).get("peak_reserved")
    real_res = fig.get("real_reserved_in_steps")
    if clean_res is not None and real_res is not None and est_reserved is not None:
        parts.append(
            f"reserved {real_res - est_reserved:+,} = cache {real_res - clean_res:+,} + requests "
            f"{clean_res - est_reserved:+,}"
        )
    parts += fig.get("errors", [])
    return "allocator: " + "; ".join(parts)
