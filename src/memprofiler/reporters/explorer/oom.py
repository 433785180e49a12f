"""The explorer's opening view of an OOM record: a banner on the failure and where the page starts.

The banner states what the allocator wrote in the history's ``oom`` entry (the block asked for
and the bytes the device had free) and, where the OOM record's YAML is at hand, what only that
file holds (the device's total, the step and the call counts). The page then opens zoomed to the
last entries before the failure, with the failing entry selected, so its live-at-instant tree is
what was alive when the allocation failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from memprofiler.analysis.snapshot.frames import PYTHON, USER, frame_kind, frame_text
from memprofiler.analysis.snapshot.replay import DeviceReplay
from memprofiler.reporters.parts.cells import b

#: The opening view covers at least this many entries before the failure ...
MIN_WINDOW = 64
#: ... or this share of the entries up to it, whichever is more: one training step of a small
#: model is some tens to hundreds of entries, so this shows the step that failed and what led to it.
WINDOW_SHARE = 0.25


@dataclass(frozen=True)
class OomView:
    """The failure the page opens on, and the figures its banner states."""

    device_slot: int
    """Index of the device in the page's device list (not the CUDA ordinal)."""
    device: int
    index: int
    """Trace entry of the ``oom`` action."""
    time_s: float | None
    """Seconds since the trace's first timed entry."""
    requested: int
    free: int | None
    total: int | None
    active: int
    reserved: int
    step: int | None
    calls: Mapping[str, int]
    frame: str | None
    """The user's frame that asked: ``name (file:line)``, else the first Python frame."""
    frame_path: str | None
    count: int
    """OOM entries in the whole snapshot (the view is on the last)."""
    t0: int
    t1: int


def user_frame(frames: Sequence[Any] | None) -> tuple[str, str] | None:
    """``(name (file:line), full path:line)`` of the first frame of the user's own code, else of
    the first Python frame; ``None`` for a stack with neither."""
    # a foreign snapshot's odd frame (not a mapping) is not one to name
    named = [f for f in frames or () if isinstance(f, Mapping)]
    kinds = [frame_kind(str(f.get("name", "?")), str(f.get("filename", "?"))) for f in named]
    for want in (USER, PYTHON):
        for f, kind in zip(named, kinds, strict=True):
            if kind & want:
                return frame_text(f, kind), f"{f.get('filename', '?')}:{f.get('line', '?')}"
    return None


def opening_window(index: int, instants: int) -> tuple[int, int]:
    """The entries ``[t0, t1)`` shown first: the last ones up to and including the failure."""
    span = min(instants, max(MIN_WINDOW, int((index + 1) * WINDOW_SHARE)))
    t1 = min(instants, index + 1 + max(1, span // 32))  # a little past it, so its mark shows
    return max(0, t1 - span), t1


def oom_view(
    data: Mapping[str, Any], replays: Sequence[DeviceReplay], record: Mapping[str, Any] | None
) -> OomView | None:
    """The last OOM of the snapshot, or ``None`` when its history holds none.

    Args:
        data: the checked ``_snapshot()`` dict.
        replays: the page's devices, in its order.
        record: the OOM record's YAML (``oom_rank_{r}_{n}.yaml``) when at hand.
    """
    traces = data.get("device_traces") or []
    found = [
        (traces[rep.device][i].get("time_us") or 0, k, i)
        for k, rep in enumerate(replays)
        for i, _ in rep.ooms
    ]
    if not found:
        return None
    _, k, i = max(found)  # the last in time
    rep = replays[k]
    device, instants = rep.device, rep.instants
    e = traces[device][i]
    rec = record or {}
    if rec.get("device") not in (None, device):
        rec = {}  # a record about another device says nothing of this one
    frame = user_frame(e.get("frames"))
    t0, t1 = opening_window(i, instants)
    calls = rec.get("calls")
    return OomView(
        device_slot=k,
        device=device,
        index=i,
        time_s=float(rep.time_us[i]) / 1e6 if rep.time_us[i] else None,
        requested=int(e.get("size", 0)),
        free=_int_or_none(e.get("device_free", rec.get("device_free_bytes"))),
        total=_int_or_none(rec.get("device_total_bytes")),
        active=int(rep.active()[i]),
        reserved=int(rep.reserved()[i]),
        step=_int_or_none(rec.get("step")),
        calls={str(n): int(c) for n, c in calls.items() if isinstance(c, int)}
        if isinstance(calls, dict)
        else {},
        frame=frame[0] if frame else None,
        frame_path=frame[1] if frame else None,
        count=len(found),
        t0=t0,
        t1=t1,
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def when_text(step: int | None, calls: Mapping[str, int]) -> str:
    """When the OOM happened, in the explorer's numbering of calls (from 1), the Trainer's step
    (``global_step``, from 0) beside it, so that "step 3" and "call 4" are not read as two times.

    Example:
        >>> when_text(3, {"training_step": 4})
        'in training_step call 4 (calls are numbered from 1, as the explorer marks them; Trainer step 3, counted from 0)'
    """
    if not calls:
        return (
            f"Trainer step {step:,} (counted from 0)"
            if step is not None
            else ("step not recorded (the OOM record's YAML has it)")
        )
    trainer = f"; Trainer step {step:,}, counted from 0" if step is not None else ""
    if len(calls) == 1:
        ((fn, n),) = calls.items()
        return f"in {fn} call {n:,} (calls are numbered from 1, as the explorer marks them{trainer})"
    so_far = ", ".join(f"{fn} {c:,}" for fn, c in calls.items())
    return f"calls so far: {so_far} (numbered from 1, as the explorer marks them{trainer})"


def banner_html(v: OomView) -> str:
    """The banner at the top of the page: the failure in one sentence, then where the page starts."""
    free = f"{b(v.free)} free" if v.free is not None else "free memory not recorded"
    total = (
        f" of {b(v.total)} total"
        if v.total is not None
        else " (total: not in the pickle; see the OOM record's YAML)"
    )
    when = f" (t={v.time_s:.6f} s)" if v.time_s is not None else ""
    step = escape(when_text(v.step, v.calls), quote=False)
    at = (
        f"at <b class='mp-oom-frame' title='{escape(v.frame_path or '', quote=True)}'>{escape(v.frame)}</b>"
        if v.frame
        else "no stack recorded"
    )
    more = f" The history holds {v.count} OOMs; this is the last." if v.count > 1 else ""
    return (
        f"<div id='mp-oom' class='mp-oom' data-requested='{v.requested}' data-free='{v.free if v.free is not None else ''}'"
        f" data-total='{v.total if v.total is not None else ''}' data-index='{v.index}'>"
        f"<b>Out of memory on device {v.device}</b> at entry {v.index:,}{when}: "
        f"<b class='mp-oom-req'>{b(v.requested)} requested</b>, {free}{total}; "
        f"{step}; {at}.<br>"
        f"<span class='muted'>When it failed: {b(v.active)} active (requested), {b(v.reserved)} reserved. "
        f"The timeline opens on entries {v.t0:,}-{v.t1 - 1:,}, the last before the failure, and the tree "
        f"below shows what was live at it (“whole trace” zooms out).{more}</span></div>"
    )


def meta(v: OomView) -> dict[str, Any]:
    """The page's opening state: the device, the view and the selected instant."""
    return {"device": v.device_slot, "t0": v.t0, "t1": v.t1, "sel": v.index}
