"""The run report's opening section, "where memory goes": per call one bar of its peak split into
parameters, gradients, optimizer state, activations, temporaries and other, with the modules
that saved the most beside it (see :mod:`~memprofiler.reporters.model.memory_split` for how the figures are split)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from memprofiler.analysis.traces.memory_categories import CategoryTimeline
from memprofiler.reporters.model.call_table import NA, CallRow
from memprofiler.reporters.model.memory_split import (
    CATEGORIES_PEAK,
    COLOURS,
    CUDA_PEAK,
    LABELS,
    PARTS,
    RSS_PEAK,
    TRACKER_PEAK,
    CallSplit,
    category_split,
    device_split,
    split_call,
    splits,
    top_calls,
    top_with_other,
)
from memprofiler.reporters.model.module_groups import SavedRollup, has_blocks, top_groups
from memprofiler.reporters.model.report import ReportModel
from memprofiler.reporters.parts import svg
from memprofiler.reporters.parts.assets import asset
from memprofiler.reporters.parts.cells import Cell, b, bytes_cell, table
from memprofiler.units import format_bytes

#: Bars drawn at most; a longer run shows its calls with the highest peaks.
MAX_BARS = 12
#: Modules listed beside the bars before the rest are summed into one "other" row.
TOP_MODULES = 8

CSS = asset("where.css")


#: Which peak a section's charts show first: the device's, then the tracker's, then the host's.
_KINDS = (CUDA_PEAK, TRACKER_PEAK, CATEGORIES_PEAK, RSS_PEAK)


def where_html(
    model: ReportModel,
    categories: Sequence[tuple[str, CategoryTimeline]] = (),
    allocator: Sequence[tuple[str, int]] = (),
) -> str:
    """The section, or an empty string when no call has a peak to split.

    It leads with one peak, the one the device enforces: the CUDA allocated peak on a GPU run,
    the host RSS peak otherwise. Every call with that peak gets its bar. The other figures of
    the run (the module-wise tracker's peak, the profiler's memory categories and its
    allocator curve) are views of the same memory: a small table gives each one's peak and
    how it differs from the headline peak, and their bars are folded below it.
    ``categories``: ``(label, timeline)`` of each profiler memory-categories timeline, a bar
    each; ``allocator``: ``(label, peak bytes)`` of each profiler trace's allocator curve.
    """
    rows, counts = top_calls(model.calls, MAX_BARS)
    calls = [model.calls[i] for i in rows]
    found = splits(calls) + [category_split(tl, label) for label, tl in categories]
    if not found:
        return ""
    counts[CATEGORIES_PEAK] = len(categories)
    multi_rank = len({s.rank for s in found if s.rank >= 0}) > 1
    lead_kind = CUDA_PEAK if model.has_cuda else RSS_PEAK
    # The call's own split where it is of the headline peak (the tracker's categories of a CUDA
    # peak), else the device's figures alone.
    lead = [s for c in calls if (s := _lead_split(c, lead_kind)) is not None]
    out = ["<h2 id='where'>Where memory goes</h2>"]
    if not lead:  # no call has the device's peak (a profiler trace alone): the first kind leads
        lead_kind = next(k for k in _KINDS if any(s.peak_name == k for s in found))
        lead = [s for s in found if s.peak_name == lead_kind]
    column = "cuda alloc peak" if lead_kind == CUDA_PEAK else "rss peak"
    n_lead = (
        sum(1 for v in model.calls.column(column) if v != NA) if lead_kind in (CUDA_PEAK, RSS_PEAK) else 0
    )
    out.append(_group(model, lead, lead_kind, multi_rank, True, max(n_lead, len(lead))))
    others = [
        (kind, group)
        for kind in _KINDS
        if kind != lead_kind and (group := [s for s in found if s.peak_name == kind])
    ]
    views = _views(model, lead_kind, lead, categories, allocator)
    if views:
        out.append(views)
    for kind, group in others:
        body = _group(model, group, kind, multi_rank, False, counts.get(kind, len(group)))
        out.append(f"<details class='mp-view'><summary>{escape(kind)}: its bars</summary>{body}</details>")
    return "\n".join(out)


def _lead_split(c: CallRow, kind: str) -> CallSplit | None:
    own = split_call(c)
    return own if own is not None and own.peak_name == kind else device_split(c, kind)


#: What each view of the peak counts, beside the headline peak, in one phrase.
_COUNTS = {
    CUDA_PEAK: "what the CUDA caching allocator had allocated at its highest: the peak an OOM is about",
    RSS_PEAK: "what the operating system counted for the process at its highest: the peak the host enforces",
    "CUDA reserved peak": "what the allocator held from the device (allocated plus cached free blocks)",
    TRACKER_PEAK: "tensors the module tracker saw in its window (created there, or registered at its start), "
    "at its own peak instant; not the allocator's rounding or cache, nor the rest of the process",
    CATEGORIES_PEAK: "the profiler's memory timeline over its traced steps, by the category it could give "
    "each tensor (the profiler section says how it differs from the allocator curve)",
    "allocator curve": "the allocator events the profiler recorded: only what was allocated while it traced",
}


def _views(
    model: ReportModel,
    lead_kind: str,
    lead: list[CallSplit],
    categories: Sequence[tuple[str, CategoryTimeline]],
    allocator: Sequence[tuple[str, int]],
) -> str:
    """The small table of the other views of the headline peak: each one's peak and its difference."""
    top = max(s.peak for s in lead)
    rows: list[tuple[str, int, str]] = []
    if lead_kind == CUDA_PEAK:
        reserved = [v for v in model.calls.column("cuda reserved peak") if v != NA]
        if reserved:
            rows.append(("CUDA reserved peak", int(max(reserved)), _COUNTS["CUDA reserved peak"]))
    tracker = [int(tp["total"]) for tp in model.calls.tracker_peaks.values() if tp.get("total")]
    if tracker:
        rows.append((TRACKER_PEAK, max(tracker), _COUNTS[TRACKER_PEAK]))
    for label, tl in categories:
        rows.append((f"{CATEGORIES_PEAK}, {label}", tl.peak_bytes, _COUNTS[CATEGORIES_PEAK]))
    for label, peak in allocator:
        rows.append((f"profiler allocator curve, {label}", peak, _COUNTS["allocator curve"]))
    if not rows:
        return ""
    cuda_lead = lead_kind == CUDA_PEAK
    body: list[list[Any]] = [
        [
            Cell(f"<b>{escape(lead_kind)}</b> (the headline peak)"),
            bytes_cell(top),
            "",
            _COUNTS.get(lead_kind, ""),
        ]
    ]
    for name, peak, what in rows:
        # A host figure beside a GPU's peak measures another device: no difference is drawn.
        other_device = cuda_lead and _host_view(name)
        diff = (
            "another device"
            if other_device
            else _signed(peak - top) + (f" ({(peak - top) / top:+.0%})" if top else "")
        )
        body.append([name, bytes_cell(peak), diff, what])
    return (
        "<div class='mp-views'><p><b>The same memory, other views.</b> "
        "The bars above are the peak the device enforces; "
        "the run's other figures count a part of it, or more, each its own way:</p>"
        + table(["view", "peak", "vs. the headline peak", "what it counts"], body)
        + "</div>"
    )


def _host_view(name: str) -> bool:
    low = name.lower()
    return low.endswith((", cpu", " cpu")) or "· cpu" in low


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "") + format_bytes(abs(n))


def _group(
    model: ReportModel, group: list[CallSplit], kind: str, multi_rank: bool, lead: bool, count: int
) -> str:
    """One kind's bars, legend, note and numbers; ``group`` is already the calls of the highest
    peaks of that kind (at most :data:`MAX_BARS`, by :func:`top_calls`), in call order."""
    note = (
        f" Shown: the {len(group)} calls with the highest peaks of {count:,}." if count > len(group) else ""
    )
    rows = [
        (
            f"{s.label} · rank {s.rank}" if multi_rank and s.rank >= 0 else s.label,
            s.peak,
            [(k, v, COLOURS[k], LABELS[k]) for k, v in s.parts],
        )
        for s in group
    ]
    worst = max(group, key=lambda s: s.peak)
    per = "profiled device" if kind == CATEGORIES_PEAK else "call"
    chart = svg.stacked_hbars(rows, format_bytes, f"{kind} per {per}, by what holds it", width=620)
    present = [k for k, _, _ in PARTS if any(k == p for s in group for p, _ in s.parts)]
    legend = "".join(
        f"<span><i style='background:{COLOURS[k]}'></i>{escape(LABELS[k])}</span>" for k in present
    )
    found = {s.source.rstrip(".") for s in group}
    # a call without saved tensors says less of the same: keep only the fullest wording
    sources = "; ".join(
        escape(t) for t in sorted(found) if not any(o != t and o.startswith(t) for o in found)
    )
    return "\n".join(
        [
            f"<p>{_headline(worst)}</p>" if lead else f"<h3>{escape(kind)}</h3>",
            f"<div class='mp-where'><div>{chart}<div class='mp-legend'>{legend}</div></div>"
            f"{_modules(model, worst) if lead else ''}</div>",
            f"<p class='muted'>Each bar is a {per}'s "
            f"{escape(kind)}, split from {sources}. The parts add "
            f"up to the peak; what no figure explains is “other”.{note}{_capped(group)}{_apart(group)}</p>",
            _numbers(group, present),
        ]
    )


def _headline(s: CallSplit) -> str:
    shown = sorted(s.parts, key=lambda kv: -kv[1])
    if s.peak_name == RSS_PEAK and not any(k in ("rise", "other") for k, _ in shown):
        shown.append(("rise", 0))  # a call that did not raise RSS says so, beside its saved bytes
    parts = ", ".join(f"{b(v)} {escape(LABELS[k])}" for k, v in shown)
    rank = f" (rank {s.rank})" if s.rank >= 0 else ""
    beside = f" Saved for backward in the call: {b(s.saved_apart)}, {_NOT_IN_BAR}." if s.saved_apart else ""
    return (
        f"<b>{escape(s.label)}</b>{rank} peaked highest: <b>{b(s.peak)}</b> ({escape(s.peak_name)}): "
        f"{parts}.{beside}"
    )


#: Why a host bar's saved-tensor bytes stand beside it.
_NOT_IN_BAR = "tensors inside the process's memory, not a part of the bar"


def _apart(shown: list[CallSplit]) -> str:
    """The note on saved-tensor bytes beside host RSS bars: why they are not a part of them."""
    apart = [s for s in shown if s.saved_apart > 0]
    if not apart:
        return ""
    gaps = [
        (s.saved_apart - rise, s, rise)
        for s in apart
        if "other" not in dict(s.parts)  # a rise is known only from a figure at the call's start
        and (rise := dict(s.parts).get("rise", 0)) < s.saved_apart
    ]
    pair = ""
    if gaps:  # the call where the two figures differ most, as the example
        _, worst, rise = max(gaps, key=lambda g: g[0])
        pair = f" ({b(worst.saved_apart)} saved, {b(rise)} RSS rise in {escape(worst.label)})"
    return (
        " The bytes saved for backward are given beside the host RSS bars, not as a part of them: "
        "the host allocator serves tensors from memory the process already holds, so the RSS rise "
        f"during a call says nothing of which bytes are activations and can be smaller than them{pair}."
    )


def _capped(shown: list[CallSplit]) -> str:
    capped = [s for s in shown if s.capped > 0]
    if not capped:
        return ""
    worst = max(capped, key=lambda s: s.capped)
    return (
        f" In {len(capped)} call(s) the saved-tensor bytes exceed the rise above the call's start "
        f"(by up to {b(worst.capped)} in {escape(worst.label)}): memory the process already held was reused, "
        "so activations are counted up to the rise."
    )


def _modules(model: ReportModel, s: CallSplit) -> str:
    """The modules that saved the most in the call of the highest peak: by block and by module
    type when the model has blocks (numbered lists), else the modules with an "other" row."""
    for i, by_module in model.calls.by_module.items():
        c = model.calls[i]
        if c.rank == s.rank and c.label == s.label and by_module:
            total = sum(by_module.values())
            if has_blocks(by_module):
                return _rollup(SavedRollup.of(s.label, by_module))
            rows = top_with_other(by_module, TOP_MODULES)
            body = [[escape(m), bytes_cell(v), f"{v / total:.1%}" if total else ""] for m, v in rows]
            return (
                f"<div><p><b>Top modules</b> by bytes saved for backward in {escape(s.label)} "
                f"({b(total)} in {len(by_module)} modules):</p>"
                + table(["module", "saved", "share"], body)
                + "</div>"
            )
    return ""


def _rollup(r: SavedRollup) -> str:
    """Bytes saved for backward by block and by module type across blocks."""
    out = [
        f"<div><p><b>Top modules</b> by bytes saved for backward in {escape(r.label)} "
        f"({b(r.total)} in {r.modules:,} modules), by block and by module type across blocks:</p>"
    ]
    for head, groups, count in (("block", r.by_block, "modules"), ("module type", r.by_type, "blocks")):
        body = [
            [
                g.name,
                bytes_cell(g.bytes),
                f"{g.bytes / r.total:.1%}" if r.total else "",
                f"{(g.modules if count == 'modules' else g.blocks) or '-'}",
            ]
            for g in top_groups(groups, TOP_MODULES)
        ]
        out.append(table([head, "saved", "share", count], body))
    return "".join(out) + "</div>"


def _numbers(shown: list[CallSplit], present: list[str]) -> str:
    body: list[list[Any]] = [
        [
            escape(s.label),
            str(s.rank),
            bytes_cell(s.peak),
            *[bytes_cell(dict(s.parts).get(k, 0)) for k in present],
        ]
        for s in shown
    ]
    head = ["call", "rank", "peak", *[LABELS[k] for k in present]]
    if any(s.saved_apart for s in shown):  # host bars: the saved bytes beside them, named apart
        head.append("saved for backward (not in the bar)")
        for row, s in zip(body, shown, strict=True):
            row.append(bytes_cell(s.saved_apart))
    return f"<details><summary>The bars in numbers</summary>{table(head, body)}</details>"
