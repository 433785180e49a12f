"""Which tensors explain the estimate's gap at the peak: a real CUDA run against the estimate, op by op.

For each panel model (``tests/fixtures/gpu_h200/panel.py``; default ``vit``, ``t5`` as built,
``t5:eager``, ``t5:sdpa`` and ``gpt2`` as a control), in a child process of its own:

1. the real run, as ``estimate_measured_h200.json`` was measured (model built under
   ``torch.device("cuda")``, the batch moved there, AdamW lr 1e-4, two steps of forward, loss,
   backward, ``step()``, ``zero_grad()``): first untagged (its step peaks are the measurement's),
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
   real blocks by their innermost transformers/torch.nn frame.

Writes ``<model>.json`` and ``<model>.txt`` per model and ``summary.json`` under ``--out`` (default
``$OUT``, else ``./gpu_probe_out``), a few KB each; the snapshot pickle only with
``--keep-snapshot``. ``--cpu-dry-run`` runs everything but the CUDA calls on CPU: the real run
is a CPU run whose synthetic history logs each op's new storages (small GPU_B / GPU_T).

    PYTHONPATH=src:tests python tools/gpu_estimate_peak.py                 # on the GPU machine
    PYTHONPATH=src:tests python tools/gpu_estimate_peak.py --cpu-dry-run --models vit,t5:eager
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PANEL_DIR = ROOT / "tests" / "fixtures" / "gpu_h200"
#: ``t5`` as built (the default attention, as ``panel.build`` measured it), then forced either way
DEFAULT_MODELS = ("vit", "t5", "t5:eager", "t5:sdpa", "gpt2")
MARK = 7777  # the step marker's requested bytes are MARK + step (an odd size no op asks for)
SETUP, UNLABELED, MIN_BLOCK = "(setup)", "(unlabeled)", 512
Event = dict[str, Any]
Groups = dict[str, list[int]]  # key -> [bytes, blocks]


# ---------------------------------------------------------------- pure analysis (unit-tested)


def rounded(nbytes: int) -> int:
    """The caching allocator's 512 B rounding of a request (the history records requests)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


@dataclass
class Call:
    """One aten op call as the dispatch saw it, with the allocator's figures over the call."""

    step: int
    op: str
    bw: bool
    module: str
    outs: frozenset[int] = frozenset()  # data pointers (estimate: allocation keys) of its outputs
    peak: int = 0  # max allocated during the call (exact on CUDA)
    after: int = 0  # allocated when it returned

    @property
    def label(self) -> str:
        return f"{self.op}{' [bw]' if self.bw else ''} @{self.module}"


@dataclass
class Block:
    addr: int
    size: int  # rounded
    meta: str
    index: int  # the event that allocated it
    frames: list[dict[str, Any]] = field(default_factory=list)
    kind: str = ""  # set by the estimate's log: workspace or scratch


def step_marks(events: Sequence[Event]) -> dict[int, int]:
    """Step -> index of its marker allocation (requested size MARK + step)."""
    return {
        ev["size"] - MARK: i
        for i, ev in enumerate(events)
        if ev.get("action") == "alloc" and MARK < ev.get("size", 0) <= MARK + 64
    }


def initial_live(snapshot: dict[str, Any], events: Sequence[Event]) -> dict[int, Block]:
    """Blocks live before the first event: freed in the trace before any allocation there, or
    still active at the end and never allocated in it (a history that wrapped or began late)."""
    seen_alloc: set[int] = set()
    out: dict[int, Block] = {}
    for ev in events:
        addr = ev.get("addr", -1)
        if ev.get("action") == "alloc":
            seen_alloc.add(addr)
        elif ev.get("action") in ("free_requested", "free_completed") and addr not in seen_alloc:
            out.setdefault(addr, Block(addr, rounded(ev["size"]), "(before history)", -1))
    for seg in snapshot.get("segments", []):
        addr = int(seg.get("address", 0))  # a segment's blocks lie one after the other from it
        for blk in seg.get("blocks", []):
            if blk.get("state") == "active_allocated" and addr not in seen_alloc:
                size = blk.get("requested_size") or blk["size"]
                out.setdefault(addr, Block(addr, rounded(size), "(before history)", -1))
            addr += int(blk["size"])
    return out


def replay(
    events: Sequence[Event], start: dict[int, Block], upto: int | None = None
) -> tuple[list[int], dict[int, Block]]:
    """Sum of live rounded blocks after each event, and the live blocks after event ``upto``.

    ``allocated_bytes`` drops at ``free_requested``; its ``free_completed`` (at once, or after a
    stream's event) changes nothing; a ``free_completed`` with no request before it frees then.
    Segment events change no allocated bytes.
    """
    live = dict(start)
    pending: set[int] = set()
    total = sum(b.size for b in live.values())
    curve: list[int] = []
    kept: dict[int, Block] = dict(live) if upto is not None and upto < 0 else {}
    for i, ev in enumerate(events):
        act, addr = ev.get("action"), ev.get("addr", -1)
        if act == "alloc":
            blk = Block(addr, rounded(ev["size"]), str(ev.get("user_metadata") or ""), i)
            blk.frames = ev.get("frames") or []
            blk.kind = str(ev.get("kind", ""))
            old = live.pop(addr, None)
            total += blk.size - (old.size if old else 0)
            live[addr] = blk
        elif act == "free_requested" or (act == "free_completed" and addr not in pending):
            old = live.pop(addr, None)
            total -= old.size if old else 0
            if act == "free_requested":
                pending.add(addr)
        elif act == "free_completed":
            pending.discard(addr)
        curve.append(total)
        if upto is not None and i == upto:
            kept = dict(live)
    return curve, kept


def label_by_outputs(events: Sequence[Event], calls: Sequence[Call], lookahead: int = 64) -> None:
    """Where the history has no user metadata (a torch without ``_set_memory_metadata``): name
    each event's call by the calls' output addresses, in order (an allocation that is no call's
    output goes to the last call that allocated an output)."""
    marks = {i: step for step, i in step_marks(events).items()}
    first: dict[int, int] = {}
    for k, call in enumerate(calls):
        first.setdefault(call.step, k)
    c: int | None = None
    marker = None
    for i, ev in enumerate(events):
        if i in marks:
            c, marker = first.get(marks[i]), ev.get("addr")
            continue
        if c is None or (ev.get("action") != "alloc" and ev.get("addr") == marker):
            continue  # before the first step (the model, the batch), or the marker's free
        if ev.get("action") == "alloc":
            for k in range(c, min(len(calls), c + lookahead)):
                if ev.get("addr") in calls[k].outs:
                    c = k
                    break
        ev["user_metadata"] = str(c)


def step_windows(events: Sequence[Event]) -> dict[int, tuple[int, int]]:
    """Step -> [first, end) event indices, from one marker to the next."""
    marks = sorted(step_marks(events).items())
    ends = [i for _, i in marks[1:]] + [len(events)]
    return {step: (i, end) for (step, i), end in zip(marks, ends, strict=True)}


def peak_moment(
    curve: Sequence[int], events: Sequence[Event], calls: Sequence[Call], lo: int, hi: int
) -> int:
    """The event in ``[lo, hi)`` at the step's peak: among the calls with events there, the one
    whose exact peak is largest; inside it the event with the most live bytes. The whole window
    when no event names a call."""
    best, best_key = -1, None
    named = {int(k) for k in (str(ev.get("user_metadata") or "") for ev in events[lo:hi]) if k.isdigit()}
    for idx in sorted(c for c in named if c < len(calls)):  # the first call at the largest peak
        if calls[idx].peak > best:
            best, best_key = calls[idx].peak, str(idx)
    inside = [i for i in range(lo, hi) if best_key is not None and events[i].get("user_metadata") == best_key]
    window = range(inside[0], inside[-1] + 1) if inside else range(lo, hi)
    return max(window, key=lambda i: (curve[i], -i)) if len(window) else lo


def frame_key(frames: Sequence[dict[str, Any]]) -> str:
    """The innermost frame in transformers/ or torch/nn/ (not Module's call machinery), else the
    innermost outside torch, as ``path:line:function``."""

    def show(fr: dict[str, Any]) -> str:
        name = str(fr.get("filename", "?"))
        for cut in ("site-packages/", "/src/", "/tools/"):
            if cut in name:
                name = name.split(cut, 1)[1]
                break
        return f"{name}:{fr.get('line', '?')}:{fr.get('name', '?')}"

    for fr in frames:
        name = str(fr.get("filename", ""))
        if ("/transformers/" in name or "/torch/nn/" in name) and not name.endswith("modules/module.py"):
            return show(fr)
    for fr in frames:
        if "/torch/" not in str(fr.get("filename", "")) and str(fr.get("filename", "")).endswith(".py"):
            return show(fr)
    return "(no python frame)"


def freed_inside(events: Sequence[Event]) -> set[int]:
    """Indices of the allocations freed by the call that made them (same metadata): scratch."""
    made: dict[int, int] = {}
    out: set[int] = set()
    for i, ev in enumerate(events):
        act, addr = ev.get("action"), ev.get("addr", -1)
        if act == "alloc":
            made[addr] = i
        elif act in ("free_requested", "free_completed") and addr in made:
            j = made.pop(addr)
            if ev.get("user_metadata") and events[j].get("user_metadata") == ev.get("user_metadata"):
                out.add(j)
    return out


def block_key(b: Block, calls: Sequence[Call], scratch: set[int], first_mark: int) -> str:
    """``op [bw] @module`` of the call that allocated ``b``; ``:: workspace`` when the call kept it
    without returning it, ``:: scratch`` when the call freed it before returning."""
    if b.meta.isdigit() and int(b.meta) < len(calls):
        call = calls[int(b.meta)]
        if b.kind:
            kind = "" if b.kind == "out" else b.kind
        elif b.addr in call.outs:
            kind = ""
        else:
            kind = "scratch" if b.index in scratch else "workspace"
        return call.label + (f" :: {kind}" if kind else "")
    if b.meta == "(before history)":
        return b.meta
    if b.index < first_mark:
        return SETUP
    return f"{UNLABELED} {frame_key(b.frames)}"


def group(blocks: dict[int, Block], key: Callable[[Block], str]) -> Groups:
    out: Groups = {}
    for b in blocks.values():
        g = out.setdefault(key(b), [0, 0])
        g[0] += b.size
        g[1] += 1
    return out


def collapse(groups: Groups, part: str) -> Groups:
    """Merge ``op [bw] @module :: kind`` keys by ``op`` (with [bw] and kind) or by ``module``."""
    out: Groups = {}
    for key, (n, c) in groups.items():
        head, sep, rest = key.partition(" @")
        if sep:
            module, _, kind = rest.partition(" :: ")
            op, bw = head.removesuffix(" [bw]"), " [bw]" if head.endswith(" [bw]") else ""
            key = f"{op}{bw}{' :: ' + kind if kind else ''}" if part == "op" else f"@{module}{bw}"
        g = out.setdefault(key, [0, 0])
        g[0] += n
        g[1] += c
    return out


def diff(real: Groups, est: Groups, top: int) -> list[dict[str, Any]]:
    """Rows ``real - estimate`` per key, largest difference first."""
    rows: list[dict[str, Any]] = []
    for key in set(real) | set(est):
        r, e = real.get(key, [0, 0]), est.get(key, [0, 0])
        if r[0] != e[0]:
            rows.append({"key": key, "delta": r[0] - e[0], "real": r[0], "est": e[0], "n": [r[1], e[1]]})
    rows.sort(key=lambda row: (-abs(row["delta"]), row["key"]))
    return rows[:top]


def module_peaks(calls: Sequence[Call], depth: int = 3) -> dict[str, int]:
    """The largest allocated inside each (step, forward/backward, module cut to ``depth`` parts),
    in the order they first ran."""
    out: dict[str, int] = {}
    for call in calls:
        key = f"s{call.step} {'bw' if call.bw else 'fw'} {'.'.join(call.module.split('.')[:depth])}"
        out[key] = max(out.get(key, 0), call.peak)
    return out


def gap_jumps(real: dict[str, int], est: dict[str, int], top: int) -> list[dict[str, Any]]:
    """Where ``real - estimate`` of the peak inside each module's forward/backward changes most
    from the module before (in the real run's order; modules on one side only are skipped)."""
    rows: list[dict[str, Any]] = []
    prev = 0
    for key, peak in real.items():
        if key in est:
            gap = peak - est[key]
            rows.append({"module": key, "jump": gap - prev, "gap": gap, "real": peak, "est": est[key]})
            prev = gap
    rows.sort(key=lambda row: -abs(row["jump"]))
    return [r for r in rows[:top] if r["jump"]]


class Side:
    """One side's history (real or estimate) and its calls: peaks, moments and live sets."""

    def __init__(self, events: Sequence[Event], calls: Sequence[Call], start: dict[int, Block]) -> None:
        self.events, self.calls, self.start = events, calls, start
        self.curve, _ = replay(events, start)
        self.windows = step_windows(events)
        self.first_mark = min((lo for lo, _ in self.windows.values()), default=len(events))
        self.scratch = freed_inside(events)

    def peak(self, step: int) -> int:
        lo, hi = self.windows[step]
        return peak_moment(self.curve, self.events, self.calls, lo, hi)

    def call_at(self, i: int) -> int | None:
        meta = str(self.events[i].get("user_metadata") or "")
        return int(meta) if meta.isdigit() and int(meta) < len(self.calls) else None

    def nth(self, idx: int) -> tuple[str, int]:
        """The call's label, and how many calls of its step with that label came before it."""
        call = self.calls[idx]
        return call.label, sum(1 for c in self.calls[:idx] if c.step == call.step and c.label == call.label)

    def moment_of(self, step: int, label: str, n: int) -> int | None:
        """The moment of most live bytes in the ``n``-th call ``label`` of ``step`` (where it made no
        event: the last event of a call before it)."""
        hits = [i for i, c in enumerate(self.calls) if c.step == step and c.label == label]
        if n >= len(hits):
            return None
        inside = [i for i, ev in enumerate(self.events) if ev.get("user_metadata") == str(hits[n])]
        if inside:
            return max(range(inside[0], inside[-1] + 1), key=lambda i: (self.curve[i], -i))
        before = [i for i in range(len(self.events)) if (self.call_at(i) or -1) in range(hits[n])]
        return before[-1] if before else None

    def key(self, b: Block) -> str:
        return block_key(b, self.calls, self.scratch, self.first_mark)

    def view(self, i: int) -> dict[str, Any]:
        """The live blocks after event ``i``, grouped, with the call running then."""
        _, live = replay(self.events, self.start, upto=i)
        idx = self.call_at(i)
        call = self.calls[idx] if idx is not None else None
        return {
            "at": call.label if call else "(between ops)",
            "call": idx,
            "call_peak": call.peak if call else None,
            "rounded_at_moment": self.curve[i],
            "groups": group(live, self.key),
            "frames": group(live, lambda b: frame_key(b.frames)),
        }


def analyze(
    events: Sequence[Event], calls: Sequence[Call], start: dict[int, Block]
) -> dict[int, dict[str, Any]]:
    """Per step: the call and moment of the peak, exact and rounded bytes there, the live blocks."""
    side = Side(events, calls, start)
    out = {}
    for step, (lo, hi) in side.windows.items():
        out[step] = side.view(side.peak(step))
        out[step]["step_call_peak"] = max((c.peak for c in calls if c.step == step), default=0)
        out[step]["rounded_max_in_step"] = max(side.curve[lo:hi])
    return out


def _same_call(
    here: Side, there: Side, step: int, idx: int | None, top: int, real_first: bool
) -> dict[str, Any] | None:
    """``there``'s live blocks in the call that matches ``here``'s call ``idx`` (label and
    occurrence in the step), diffed real - estimate against ``here``'s at its peak."""
    if idx is None:
        return None
    label, n = here.nth(idx)
    j = there.moment_of(step, label, n)
    if j is None:
        return {"call": label, "occurrence": n, "missing": True}
    mine, theirs = here.view(here.peak(step)), there.view(j)
    real, est = (mine, theirs) if real_first else (theirs, mine)
    return {
        "call": label,
        "occurrence": n,
        "other_rounded": theirs["rounded_at_moment"],
        "other_call_peak": theirs["call_peak"],
        "delta_rounded": real["rounded_at_moment"] - est["rounded_at_moment"],
        "by_key": diff(real["groups"], est["groups"], top),
    }


def _cross(real: Side, est: Side, step: int, ri: int | None, ei: int | None, top: int) -> dict[str, Any]:
    """Each side inside the other's peak call, unless both peak in the same call."""
    if ri is not None and ei is not None and real.nth(ri) == est.nth(ei):
        return {"same_peak_call": True}
    return {
        "est_in_real_peak_call": _same_call(real, est, step, ri, top, True),
        "real_in_est_peak_call": _same_call(est, real, step, ei, top, False),
    }


def compare(real: Side, est: Side, top: int) -> list[dict[str, Any]]:
    """Per step, real against estimate at each side's own peak, and each side at the other's peak call."""
    steps = []
    for step in sorted(set(real.windows) & set(est.windows)):
        r, e = real.view(real.peak(step)), est.view(est.peak(step))
        by_key = diff(r["groups"], e["groups"], top)
        total = r["rounded_at_moment"] - e["rounded_at_moment"]
        steps.append(
            {
                "step": step,
                "real_at": r["at"],
                "est_at": e["at"],
                "real_call_peak": r["call_peak"],
                "est_call_peak": e["call_peak"],
                "delta_rounded": total,
                "delta_exact": (r["call_peak"] or 0) - (e["call_peak"] or 0),
                "real_slack": (r["call_peak"] or 0) - r["rounded_at_moment"],
                "est_slack": (e["call_peak"] or 0) - e["rounded_at_moment"],
                "by_key": by_key,
                "by_key_rest": total - sum(row["delta"] for row in by_key),
                "by_op": diff(collapse(r["groups"], "op"), collapse(e["groups"], "op"), top // 2),
                "by_module": diff(collapse(r["groups"], "module"), collapse(e["groups"], "module"), top // 2),
                **_cross(real, est, step, r["call"], e["call"], top // 2),
                "real_by_frame": sorted(
                    ([k, *v] for k, v in r["frames"].items()), key=lambda row: -int(row[1])
                )[:12],
            }
        )
    return steps


def headline(result: dict[str, Any]) -> str:
    """A few lines per model for the end of the output: peaks and the four largest differences."""
    real, est = result.get("real", {}), result.get("estimate", {})
    lines = [
        f"{result['model']} (transformers {result.get('transformers')}): {result.get('stage')}"
        + (f"  ERROR {result['error']}" if result.get("error") else ""),
        f"  real step peaks {[p[0] for p in real.get('step_peaks', [])]} untagged "
        f"{[p[0] for p in real.get('plain_step_peaks', [])]} fixture {real.get('fixture_step_peaks')}"
        f" estimate {est.get('step_peaks')}; attention {real.get('attn_impl')}: {sorted(real.get('attention_ops', {}))}",
    ]
    for s in result.get("steps", []):
        top = "; ".join(f"{r['key']} {r['delta']:+,}" for r in s["by_key"][:4])
        lines.append(
            f"  step {s['step']} real-est {s['delta_exact']:+,} (blocks {s['delta_rounded']:+,}): {top}"
        )
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """The text diff: a header, then per step the largest differences."""
    real, est = result.get("real", {}), result.get("estimate", {})
    lines = [
        f"== {result['model']}  [{result.get('device', '?')}; torch {result.get('torch')}; "
        f"transformers {result.get('transformers')}]",
        f"real: attention {real.get('attn_impl')} ops {real.get('attention_ops')}; step peaks "
        f"{[p[0] for p in real.get('step_peaks', [])]} (untagged {[p[0] for p in real.get('plain_step_peaks', [])]}, "
        f"fixture {real.get('fixture_step_peaks')}); "
        f"cuBLAS workspaces {real.get('cublas_workspace_bytes')}",
        f"estimate: step peaks {est.get('step_peaks')} (peak_bytes {est.get('peak_bytes')}) "
        f"at {est.get('peak_at')}; workspaces {est.get('workspace_bytes')}",
    ]
    if real and not real.get("events_with_metadata"):
        lines.append(
            "WARNING: no user metadata in the history: blocks fall under (setup)/(unlabeled) by frame"
        )
    if result.get("error"):
        lines.append(f"ERROR ({result.get('stage')}): {result['error']}")
        for part, tb in (result.get("tracebacks") or {}).items():
            lines.append(f"--- traceback ({part}), last lines:\n{tb[-1500:]}")
        if result.get("stderr_tail"):
            lines.append(f"--- stderr, last lines:\n{result['stderr_tail'][-1500:]}")
    for s in result.get("steps", []):
        lines.append(
            f"-- step {s['step']}: real - estimate at the peaks: {s['delta_exact']:+,} B "
            f"({s['real_call_peak'] or 0:,} - {s['est_call_peak'] or 0:,}), {s['delta_rounded']:+,} B in blocks rounded "
            f"(block slack real {s['real_slack']:,}, est {s['est_slack']:,})"
        )
        lines.append(f"   real peak in {s['real_at']}; estimate peak in {s['est_at']}")
        for title, rows in (
            ("by op @module", s["by_key"]),
            ("by op", s["by_op"]),
            ("by module", s["by_module"]),
        ):
            lines.append(f"   {title}:   delta            real             est   blocks(real/est)  key")
            for row in rows:
                lines.append(
                    f"   {row['delta']:+15,} {row['real']:15,} {row['est']:15,}  {row['n'][0]:>5}/{row['n'][1]:<5}  {row['key']}"
                )
        lines.append(f"   (rest of the difference outside the rows above: {s['by_key_rest']:+,} B)")
        for title, same in (
            ("the estimate inside the real peak's call", s.get("est_in_real_peak_call")),
            ("the real run inside the estimate peak's call", s.get("real_in_est_peak_call")),
        ):
            if not same:
                continue
            head = f"   {title} ({same['call']} #{same['occurrence']})"
            if same.get("missing"):
                lines.append(head + ": no such call there")
                continue
            lines.append(
                f"{head}: {same['other_rounded']:,} B in blocks (call peak {same['other_call_peak']}); "
                f"real - estimate {same['delta_rounded']:+,}"
            )
            lines += [
                f"   {r['delta']:+15,} {r['real']:15,} {r['est']:15,}  {r['key']}" for r in same["by_key"]
            ]
    jumps = result.get("gap_jumps") or []
    if jumps:
        lines.append("-- where real - estimate of the peak inside a module's forward/backward changes most:")
        lines.append("            jump     to real - est             real              est  module")
        lines += [
            f"   {j['jump']:+15,} {j['gap']:+16,} {j['real']:16,} {j['est']:16,}  {j['module']}"
            for j in jumps
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------- the real run


def _storage_ptrs(out: Any, ptr: Callable[[Any], int]) -> frozenset[int]:
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(out)
    ptrs = set()
    for t in leaves:
        if isinstance(t, torch.Tensor):
            with contextlib.suppress(Exception):  # a tensor without storage: not an allocation
                ptrs.add(ptr(t.untyped_storage()))
    return frozenset(ptrs)


class CudaBackend:
    """The allocator's history and exact per-call peaks (peak stats reset before each op)."""

    def __init__(self, max_entries: int) -> None:
        import torch

        self.torch = torch
        self.mem = torch.cuda.memory
        self.metadata = hasattr(self.mem, "_set_memory_metadata")
        self.mem._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=max_entries
        )
        torch.cuda.reset_peak_memory_stats()
        self.step_max = self.step_reserved = 0

    def _fold(self) -> None:
        cuda = self.torch.cuda
        self.step_max = max(self.step_max, cuda.max_memory_allocated())
        self.step_reserved = max(self.step_reserved, cuda.max_memory_reserved())
        cuda.reset_peak_memory_stats()

    def begin(self, idx: int) -> None:
        self._fold()  # what happened between ops counts for the step
        if self.metadata:
            self.mem._set_memory_metadata(str(idx))

    def end(self, call: Call, out: Any) -> None:
        if self.metadata:
            self.mem._set_memory_metadata("")
        cuda = self.torch.cuda
        call.peak, call.after = cuda.max_memory_allocated(), cuda.memory_allocated()
        self._fold()
        call.outs = _storage_ptrs(out, lambda st: int(st.data_ptr()))

    def setup(self, tensors: Sequence[Any]) -> None:
        return

    def mark(self, step: int) -> None:
        x = self.torch.empty(MARK + step, dtype=self.torch.uint8, device="cuda")
        del x

    def step_end(self) -> list[int]:
        self.torch.cuda.synchronize()
        self._fold()
        peaks = [self.step_max, self.step_reserved]
        self.step_max = self.step_reserved = 0
        return peaks

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = self.mem._snapshot()
        self.mem._record_memory_history(enabled=None)
        return snap

    def events(self, snap: dict[str, Any]) -> list[Event]:
        traces = snap.get("device_traces") or [[]]
        return list(traces[self.torch.cuda.current_device()] if len(traces) > 1 else traces[0])

    def cublas_workspace(self) -> int:
        before = self.torch.cuda.memory_allocated()
        self.torch._C._cuda_clearCublasWorkspaces()
        return before - self.torch.cuda.memory_allocated()


class CpuBackend:
    """``--cpu-dry-run``: a history like the allocator's, of the storages CPU ops create."""

    def __init__(self) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.log: list[Event] = []
        self.addr: Any = WeakIdKeyDictionary()
        self.next_addr = itertools.count(1 << 20)
        self.local = threading.local()
        self.allocated = self.peak_since = self.step_max = 0
        self.metadata = True

    def _meta(self) -> str:
        return str(getattr(self.local, "meta", ""))

    def _alloc(self, size: int, frames: bool = True) -> int:
        addr = next(self.next_addr) * MIN_BLOCK
        stack = traceback.extract_stack(limit=40)[::-1] if frames else []
        fr = [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in stack]
        self.log.append(
            {"action": "alloc", "addr": addr, "size": size, "user_metadata": self._meta(), "frames": fr}
        )
        self.allocated += rounded(size)
        self.peak_since = max(self.peak_since, self.allocated)
        return addr

    def _free(self, addr: int, size: int) -> None:
        for act in ("free_requested", "free_completed"):
            self.log.append({"action": act, "addr": addr, "size": size, "user_metadata": self._meta()})
        self.allocated -= rounded(size)

    def _track(self, st: Any) -> int:
        if st not in self.addr:
            addr = self._alloc(int(st.nbytes()))
            self.addr[st] = addr
            weakref.finalize(st, self._free, addr, int(st.nbytes()))
        return int(self.addr[st])

    def begin(self, idx: int) -> None:
        self.step_max = max(self.step_max, self.peak_since)
        self.peak_since = self.allocated
        self.local.meta = str(idx)

    def end(self, call: Call, out: Any) -> None:
        call.outs = _storage_ptrs(out, self._track)
        self.local.meta = ""
        call.peak, call.after = self.peak_since, self.allocated
        self.step_max = max(self.step_max, self.peak_since)
        self.peak_since = self.allocated

    def setup(self, tensors: Sequence[Any]) -> None:
        for t in tensors:
            self._track(t.untyped_storage())

    def mark(self, step: int) -> None:
        self._free(self._alloc(MARK + step, frames=False), MARK + step)

    def step_end(self) -> list[int]:
        peaks = [max(self.step_max, self.peak_since), 0]
        self.step_max, self.peak_since = 0, self.allocated
        return peaks

    def snapshot(self) -> dict[str, Any]:
        return {"segments": [], "device_traces": [list(self.log)]}

    def events(self, snap: dict[str, Any]) -> list[Event]:
        return list(snap["device_traces"][0])

    def cublas_workspace(self) -> int:
        return 0


def _tagger(backend: Any, mt: Any) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    from memprofiler.estimate.tracker import _deepest

    class OpTagger(TorchDispatchMode):
        """Every aten op: a :class:`Call` (op, module, forward/backward) and the backend's figures."""

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[Call] = []
            self.step = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            call = Call(self.step, str(func), bool(mt.is_bw), _deepest(mt.parents))
            self.calls.append(call)
            backend.begin(len(self.calls) - 1)
            out = None
            try:
                out = func(*args, **(kwargs or {}))
                return out
            finally:
                backend.end(call, out)

    return OpTagger()


def load_panel() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_probe_panel", PANEL_DIR / "panel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def set_attention(model: Any, attn: str | None) -> None:
    """As benchmarks/estimate_gpu.py does: every config the model holds."""
    if attn is None:
        return
    for m in model.modules():
        if hasattr(m, "config"):
            m.config._attn_implementation = attn


def plain_run(panel: Any, name: str, attn: str | None) -> dict[str, Any]:
    """The two steps as measured, nothing recorded or tagged (max allocated / reserved per step),
    then everything freed, the cuBLAS workspaces and the cache too: the tagged run starts fresh."""
    import gc

    import torch
    from torch.utils._pytree import tree_map_only

    make_model, make_batch = panel.PANEL[name]
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = make_model()
    set_attention(model, attn)
    model.train()
    batch = tree_map_only(torch.Tensor, lambda t: t.to("cuda"), make_batch())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    peaks = []
    for _ in (1, 2):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        torch.cuda.reset_peak_memory_stats()
    del model, batch, opt, loss
    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return {"plain_step_peaks": peaks, "allocated_after_plain_run": torch.cuda.memory_allocated()}


def real_run(panel: Any, name: str, attn: str | None, cuda: bool, max_entries: int) -> dict[str, Any]:
    import torch
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.utils._pytree import tree_map_only

    make_model, make_batch = panel.PANEL[name]
    device = "cuda" if cuda else "cpu"
    plain: dict[str, Any] = {}
    if cuda:
        try:
            plain = plain_run(panel, name, attn)
        except Exception as err:  # the tagged run still goes
            plain = {"plain_error": f"{type(err).__name__}: {err}"}
    backend: Any = CudaBackend(max_entries) if cuda else CpuBackend()
    torch.manual_seed(0)
    with torch.device(device):
        model = make_model()
    set_attention(model, attn)
    model.train()
    batch = tree_map_only(torch.Tensor, lambda t: t.to(device), make_batch())
    backend.setup([*model.parameters(), *model.buffers(), *batch.values()])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mt = ModTracker()
    tagger = _tagger(backend, mt)
    peaks = []
    with mt:
        for step in (1, 2):
            backend.mark(step)
            tagger.step = step
            with tagger:
                loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            peaks.append(backend.step_end())
    snap = backend.snapshot()
    calls: list[Call] = tagger.calls
    ops: dict[str, int] = {}
    for c in calls:
        if "attention" in c.op or "softmax" in c.op or "sdp" in c.op:
            ops[c.op] = ops.get(c.op, 0) + 1
    info: dict[str, Any] = {
        **plain,
        "step_peaks": peaks,
        "attn_impl": getattr(getattr(model, "config", None), "_attn_implementation", None),
        "attention_ops": ops,
        "metadata_supported": backend.metadata,
        "calls": len(calls),
        "cublas_workspace_bytes": backend.cublas_workspace(),
    }
    if cuda:
        b = torch.backends
        info["sdp_flags"] = {
            k: getattr(b.cuda, f"{k}_sdp_enabled")() for k in ("flash", "mem_efficient", "math", "cudnn")
        }
        info["cudnn"] = b.cudnn.version()
        info["allocator_settings"] = snap.get("allocator_settings")
    events = backend.events(snap)
    info["events"] = len(events)
    info["events_with_metadata"] = sum(1 for ev in events if ev.get("user_metadata"))
    return {"info": info, "events": events, "calls": calls, "snapshot": snap}


# ---------------------------------------------------------------- the estimate, logged the same way


class EstimateLog:
    """Patches the estimate's dispatch, workspaces and allocator replay to log its allocations as
    the real history does: one event per alloc/free, the call's index as metadata, markers per step."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.calls: list[Call] = []
        self.live: set[int] = set()
        self.step = self.depth = 0
        self.window: int | None = None
        self.kind = "out"
        self.allocated = 0
        self.step_peaks: dict[int, int] = {}

    # the outermost patched dispatch opens a call; the tracker's names it
    def open(self, named: Any, func: Any) -> None:
        from memprofiler.estimate.tracker import _deepest

        self.depth += 1
        if self.depth == 1:
            self.window = len(self.calls)
            self.calls.append(Call(self.step, "(no op)", False, "?", peak=self.allocated))
        call = self.calls[self.window] if self.window is not None else None
        if named is not None and call is not None and call.op == "(no op)":
            mt = named._mod_tracker
            call.op, call.bw, call.module = str(func), bool(mt.is_bw), _deepest(mt.parents)

    def close(self) -> None:
        self.depth -= 1
        if self.depth == 0 and self.window is not None:
            self.calls[self.window].after = self.allocated
            self.window = None

    def on_alloc(self, allocator: Any, key: int, nbytes: int) -> None:
        self.allocated = allocator.allocated
        meta = str(self.window) if self.window is not None else ""
        self.events.append(
            {"action": "alloc", "addr": key, "size": nbytes, "user_metadata": meta, "kind": self.kind}
        )
        self.live.add(key)
        if self.window is not None:
            call = self.calls[self.window]
            call.peak = max(call.peak, self.allocated)
        self.step_peaks[self.step] = max(self.step_peaks.get(self.step, 0), self.allocated)

    def on_free(self, allocator: Any, key: int) -> None:
        self.allocated = allocator.allocated
        if key in self.live:
            self.live.discard(key)
            meta = str(self.window) if self.window is not None else ""
            self.events.append({"action": "free_requested", "addr": key, "size": 0, "user_metadata": meta})

    def mark(self, step: int) -> None:
        self.step = step
        addr = -3_000_000 - step
        self.events.append({"action": "alloc", "addr": addr, "size": MARK + step, "user_metadata": ""})
        self.events.append(
            {"action": "free_requested", "addr": addr, "size": MARK + step, "user_metadata": ""}
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[EstimateLog]:
        from memprofiler.estimate import allocator as al
        from memprofiler.estimate import engine
        from memprofiler.estimate import tracker as trk
        from memprofiler.estimate import workspaces as ws

        log = self
        saved: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            saved.append((owner, name, orig))
            setattr(owner, name, make(orig))

        def dispatch(named: bool) -> Callable[[Any], Any]:
            def make(orig: Any) -> Any:
                def wrapped(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                    log.open(mode if named else None, func)
                    try:
                        return orig(mode, func, types, args, kwargs)
                    finally:
                        log.close()

                return wrapped

            return make

        def kind(name: str) -> Callable[[Any], Any]:
            def make(orig: Any) -> Any:
                def wrapped(tracker: Any, *args: Any) -> Any:
                    log.kind = name
                    try:
                        return orig(tracker, *args)
                    finally:
                        log.kind = "out"

                return wrapped

            return make

        def alloc(orig: Any) -> Any:
            def wrapped(replay: Any, key: int, nbytes: int, stream: int = 0) -> None:
                orig(replay, key, nbytes, stream)
                if nbytes > 0:
                    log.on_alloc(replay, key, nbytes)

            return wrapped

        def free(orig: Any) -> Any:
            def wrapped(replay: Any, key: int) -> None:
                orig(replay, key)
                log.on_free(replay, key)

            return wrapped

        def one_step(orig: Any) -> Any:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                log.mark(log.step + 1)
                return orig(*args, **kwargs)

            return wrapped

        patch(trk.SingleTracker, "__torch_dispatch__", dispatch(True))
        patch(ws.BlasWorkspaces, "__torch_dispatch__", dispatch(False))
        patch(trk.SingleTracker, "hold", kind("workspace"))
        patch(trk.SingleTracker, "transient", kind("scratch"))
        patch(al.AllocatorReplay, "alloc", alloc)
        patch(al.AllocatorReplay, "free", free)
        patch(engine, "_one_step", one_step)
        try:
            yield self
        finally:
            for owner, name, orig in reversed(saved):
                setattr(owner, name, orig)


def estimate_run(
    panel: Any, name: str, attn: str | None, gpu: str | None, device: str, version: str | None = None
) -> dict[str, Any]:
    import torch

    from memprofiler.estimate import estimate_memory

    make_model, make_batch = panel.PANEL[name]
    torch.manual_seed(0)
    with torch.device("meta"):
        model = make_model()
    set_attention(model, attn)
    model.train()
    version = version or ".".join(torch.__version__.split("+")[0].split(".")[:2])
    with EstimateLog().installed() as log:
        est = estimate_memory(
            model,
            make_batch(),
            optimizer=panel.OPTIMIZERS["adamw"],
            loss_fn=panel.hf_loss,
            precision="32-true",
            gpu=gpu,
            torch_version=version,
            device=device,
        )
    info = {
        "peak_bytes": est.peak_bytes,
        "reserved_peak_bytes": est.reserved_peak_bytes,
        "step_peaks": [log.step_peaks.get(s, 0) for s in (1, 2)],
        # the log replays what the estimate replayed: its peak is the estimate's (CUDA view)
        "log_matches_estimate": max(log.step_peaks.values(), default=0) == est.peak_bytes,
        "peak_at": f"{est.peak_module} ({est.peak_phase}, step {est.peak_step})",
        "by_category": est.by_category,
        "workspace_bytes": est.workspace_bytes,
        "target": est.target,
        "device": device,
        "notes": est.notes[:8],
    }
    return {"info": info, "events": log.events, "calls": log.calls}


# ---------------------------------------------------------------- one model (child), all models (parent)


def fixture_peaks(name: str) -> list[int] | None:
    """The measured step peaks for this model, where the batch is the measured one (B=8, T=512);
    which attention the measured T5 ran is not recorded, so every t5 row is compared."""
    if (os.environ.get("GPU_B"), os.environ.get("GPU_T")) != ("8", "512"):
        return None
    data = json.loads((PANEL_DIR / "estimate_measured_h200.json").read_text())
    for row in data["rows"]:
        if row["name"] == name and row["precision"] == "32-true":
            return list(row["step_peaks"])
    return None


def tag_of(spec: str) -> str:
    """``t5:eager@alt`` -> ``t5_eager_alt`` (``@alt``: run with ``--also-with``'s packages first)."""
    return spec.replace(":", "_").replace("@", "_")


def child(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(os.environ.get("PROBE_THREADS", "4")))
    name, _, attn_text = spec.split("@", 1)[0].partition(":")
    attn = attn_text or None
    out = Path(args.out)
    cuda = not args.cpu_dry_run and torch.cuda.is_available()
    result: dict[str, Any] = {
        "model": spec,
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
    real = stage("real", lambda: real_run(panel, name, attn, cuda, args.max_entries))
    if real is not None:
        result["real"] = {**real["info"], "fixture_step_peaks": fixture_peaks(name)}
        if args.keep_snapshot:
            with open(out / f"{tag_of(spec)}_snapshot.pickle", "wb") as f:
                pickle.dump(real["snapshot"], f)
    gpu = args.gpu or (None if cuda else "H200")
    version = args.torch_version or (None if cuda else "2.11")  # the dry run models the measured torch
    est = stage("estimate", lambda: estimate_run(panel, name, attn, gpu, args.estimate_device, version))
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
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="panel names, :attention to set one")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_probe_out")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "0") or 0))
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("PROBE_TIMEOUT", "150")))
    ap.add_argument("--top", type=int, default=16, help="rows per diff")
    ap.add_argument("--max-entries", type=int, default=2_000_000, help="allocator history entries")
    ap.add_argument("--gpu", default=None, help="the estimate's target (default: this GPU; dry run: H200)")
    ap.add_argument("--torch-version", help="the estimate's torch release (default: this one; dry run: 2.11)")
    ap.add_argument("--estimate-device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--cpu-dry-run", action="store_true", help="no CUDA: a CPU run stands for the real one")
    ap.add_argument("--keep-snapshot", action="store_true", help="also write the snapshot pickles (MBs)")
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
                "seconds": {"wall": res.get("wall_seconds"), **(res.get("seconds") or {})},
            }
        )
    total = round(time.perf_counter() - t0, 1)
    (Path(args.out) / "summary.json").write_text(
        json.dumps({"total_seconds": total, "rows": summary}, indent=1)
    )
    print("== headlines (real - estimate at each side's peak; details in <model>.txt)")
    for res in results:
        print(headline(res))
    print(f"== {len(specs)} models in {total} s (workers {workers}); JSON and text under {args.out}")
    for row in summary:
        print(f"   {row['model']}: {row['stage']} {row['seconds']} {row['error'] or ''}")
    return 0 if all(r["stage"] == "done" for r in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
