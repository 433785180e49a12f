"""The real run's history against the estimate's, at each side's peak and inside the other's peak call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .history import (
    Block,
    Call,
    Event,
    block_key,
    collapse,
    diff,
    frame_key,
    freed_inside,
    group,
    peak_moment,
    replay,
    step_windows,
)


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
