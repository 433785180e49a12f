"""HTML sections of the profiler views (memory, memory by category, operators, modules, steps,
ranks), inline: SVG drawn here, data and a small script in the page, nothing fetched.

The memory curve takes a range selection (drag across it): the script recomputes the memory
events and per-operator statistics tables of that device from the events embedded in the
page, as the reader (:mod:`memprofiler.analysis.traces.stream`) does for the whole trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from memprofiler.analysis.traces.memory import MemPair, MemStat
from memprofiler.analysis.traces.memory_categories import CategoryTimeline, TensorOrigin, thinned
from memprofiler.analysis.traces.ops import OpRow
from memprofiler.analysis.traces.peak_gap import PeakGap, trace_device
from memprofiler.analysis.traces.steps import STEP_PARTS
from memprofiler.analysis.traces.views import DeviceView, ProfilerViews, TraceView
from memprofiler.reporters.parts import svg
from memprofiler.reporters.parts.assets import asset
from memprofiler.reporters.parts.cells import json_script, page
from memprofiler.reporters.traces.overview import CSS as OVERVIEW_CSS
from memprofiler.reporters.traces.overview import SCRIPT as OVERVIEW_SCRIPT
from memprofiler.reporters.traces.overview import (
    categories_id,
    memory_id,
    modules_id,
    op_row_id,
    ops_id,
    overview_html,
    shown_ops,
    stat_row_id,
    stats_id,
    steps_id,
)
from memprofiler.units import format_bytes

#: Rows of the memory events table drawn in the page (the largest first); the rest are counted.
PAIR_ROWS = 300
#: A table longer than this scrolls in a box of its own, so the page stays a page.
SCROLL_ROWS = 20
#: Category colours: parameter, optimizer state, input, temporary, activation, gradient,
#: autograd detail, unknown (by name, so a new torch category gets the last one).
_CAT_COLOURS = {
    "parameter": "#009E73",
    "optimizer_state": "#E69F00",
    "input": "#000000",
    "temporary": "#CC79A7",
    "activation": "#D55E00",
    "gradient": "#0072B2",
    "autograd_detail": "#56B4E9",
    "unknown": "#999999",
}
_MEM_STAT_COLS = (
    "operator", "calls", "size increase", "self size increase", "allocation count",
    "self allocation count", "allocation size", "self allocation size",
)  # fmt: skip
_PAIR_COLS = ("operator", "size", "allocation time (ms)", "release time (ms)", "duration (ms)")


def profiler_sections(views: ProfilerViews, top: int = 30) -> str:
    """Every profiler section of ``views``, for a run report or a page of its own."""
    out = [
        f"<style>{OVERVIEW_CSS}</style><h2 id='profiler'>Profiler traces</h2>",
        _NOTE,
        overview_html(views),
    ]
    for n, tv in enumerate(views.traces):
        out.append(_trace_html(tv, n, top))
    if views.ranks:
        out.append(_ranks_html(views))
    out.append(f"<script>{_SCRIPT}</script><script>{OVERVIEW_SCRIPT}</script>")
    return "\n".join(out)


def profiler_page(views: ProfilerViews, title: str, top: int = 30) -> str:
    """A page holding only the profiler views (traces given without a run directory)."""
    return page(title, f"<h1>{escape(title)}</h1>\n" + profiler_sections(views, top))


_NOTE = (
    "<p class='muted'>Summaries of the PyTorch profiler's traces. Times are milliseconds from each "
    "trace's first event; click a column header to sort, a folded title to open its table. Open the trace itself in "
    "<span class='mono'>ui.perfetto.dev</span> for the timeline.</p>"
)


def _trace_html(tv: TraceView, n: int, top: int) -> str:
    rank = "" if tv.rank is None else f" · rank {tv.rank}"
    out = [f"<h3 id='trace-{n}'>{escape(tv.title)}{rank}</h3>", f"<p class='muted'>{tv.events:,} events</p>"]
    out += [f"<p class='oom'>warning: {escape(note)}</p>" for note in tv.notes]
    out.append(_steps_html(tv, n))
    for d, dv in enumerate(tv.devices):
        out.append(_memory_html(dv, n, d))
    for c, tl in enumerate(tv.categories):
        gap = next((g for g in tv.peak_gaps if g.device == trace_device(tl.device)), None)
        out.append(_categories_html(tl, categories_id(n, c), gap))
    idx = shown_ops(tv, top)
    out.append(
        _ops_html(
            [tv.ops[i] for i in idx], "Operators", "operator", tv.has_device_time, len(tv.ops), shapes=True,
            key=ops_id(n), row_ids=[op_row_id(n, i) for i in idx], listed=top,
        )
    )  # fmt: skip
    if tv.wrapper_note:
        out.append(f"<p class='muted'>{escape(tv.wrapper_note)}</p>")
    if tv.modules:
        out.append(
            _ops_html(
                tv.modules[:top], "Modules", "module", tv.has_device_time, len(tv.modules), key=modules_id(n)
            )
        )
    return "\n".join(out)


def _fold(key: str, title: str, body: str, rows: int) -> str:
    """A folded section: its title always shown, its table on a click (or a link to it); a long
    table scrolls in its own box."""
    if rows > SCROLL_ROWS:
        body = f"<div class='scroll'>{body}</div>"
    return (
        f"<details class='pv-fold' id='{escape(key, quote=True)}'><summary>{title}</summary>{body}</details>"
    )


def _ms(us: float) -> str:
    return f"{us / 1000:,.3f}"


def _cell(text: str, v: float | int | str | None = None, num: bool = True, title: str = "") -> str:
    attr = "" if v is None else f" data-v='{escape(str(v))}'"
    tip = f" title='{escape(title)}'" if title else ""
    return f"<td{' class=n' if num else ''}{attr}{tip}>{escape(text)}</td>"


def _bytes(n: int) -> str:
    return _cell(format_bytes(n), n, title=f"{n:,} bytes")


def _table(cols: Sequence[str], rows: Sequence[str], cls: str = "sortable", attrs: str = "") -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    return f"<table class='{cls}'{attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _steps_html(tv: TraceView, n: int) -> str:
    rows = [
        "<tr>"
        + _cell(s.step, num=False)
        + _cell(_ms(s.total_us), s.total_us)
        + "".join(_cell(_ms(s.parts[p]), s.parts[p]) for p in STEP_PARTS)
        + "</tr>"
        for s in tv.steps
    ]
    table = _table(["step", "total", *STEP_PARTS], rows)
    return _fold(steps_id(n), f"Step time breakdown (ms), {len(rows):,} step(s)", table, len(rows))


#: Host memory in a trace below this many bytes gets a line, not a chart.
SMALL_CPU_CHART = 2**20


def _memory_html(dv: DeviceView, n: int, d: int) -> str:
    key = memory_id(n, d)
    dm = dv.memory
    series = [
        ("allocated", [(t, float(a)) for t, a, _ in dm.curve]),
        ("reserved", [(t, float(r)) for t, _, r in dm.curve]),
    ]
    peak = (
        dm.peak_ms,
        float(dm.peak_allocated),
        f"peak {format_bytes(dm.peak_allocated)} at {dm.peak_ms:.3f} ms",
    )
    if dm.device == "CPU" and max(dm.peak_allocated, dm.peak_reserved) < SMALL_CPU_CHART:
        # A GPU run's trace holds a few KiB of host tensors: a chart of them says nothing.
        chart = (
            f"<p class='muted'>{escape(dm.device)}: at most {format_bytes(dm.peak_allocated)} allocated in this "
            f"trace, under {format_bytes(SMALL_CPU_CHART)}: no chart.</p>"
        )
    else:
        chart = svg.line_chart(
            series,
            format_bytes,
            f"{dm.device}: memory over time (ms)",
            marker=peak,
            from_zero=dm.device != "CPU",
        )
    lo, hi = (dm.curve[0][0], dm.curve[-1][0]) if dm.curve else (0.0, 0.0)
    out = [
        f"<h4>Memory: {escape(dm.device)}</h4>",
        f"<div class='memview' id='{key}' data-lo='{lo}' data-hi='{hi}'>{chart}",
        f"<p class='muted range'>Whole trace: {dm.peak_allocated:,} bytes allocated at the peak "
        f"({format_bytes(dm.peak_allocated)}), {format_bytes(dm.peak_reserved)} reserved at most. ",
        _range_note(dv),
        "<button type='button' class='reset'>whole trace</button>" if dv.range_data is not None else "",
        _fold(
            f"{key}-events",
            f"Memory events ({dv.pair_count:,} allocations and releases)",
            _pairs_table(dv.pairs, dv.pair_count),
            0,  # the events table has its own scrolling box
        ),
        _fold(
            stats_id(n, d),
            f"Memory statistics per operator ({len(dv.stats):,} operators)",
            _table(
                _MEM_STAT_COLS,
                [_stat_row(s, stat_row_id(n, d, k)) for k, s in enumerate(dv.stats)],
                attrs=" data-kind='stats'",
            ),
            len(dv.stats),
        ),
    ]
    if dv.range_data is not None:
        data = json_script({**dv.range_data, "rows": PAIR_ROWS})  # the script shows at most PAIR_ROWS pairs
        out.append(f"<script type='application/json' class='memdata'>{data}</script>")
    out.append("</div>")
    return "\n".join(out)


def _range_note(dv: DeviceView) -> str:
    rd, n = dv.range_data, dv.memory.event_count
    if rd is None:
        return f"Over {n:,} events: the tables cover the whole trace (no range selection).</p>"
    if "bins" not in rd:
        return "Drag across the chart to select a range.</p>"
    kept = (
        ""
        if dv.pair_count == len(dv.pairs)
        else f" (of the {len(dv.pairs):,} largest allocations and releases)"
    )
    return (
        f"Drag across the chart to select a range: over {n:,} events, a range is widened to whole "
        f"bins of about {-(-n // len(rd['bins'])):,} events ({len(rd['bins']):,} bins){kept}.</p>"
    )


def _pairs_table(pairs: list[MemPair], count: int) -> str:
    shown = sorted(pairs, key=lambda p: -p.size)[:PAIR_ROWS]
    rows = [_pair_row(p) for p in shown]
    more = count - len(shown)
    note = (
        f"<p class='muted more'>{more:,} smaller ones not shown.</p>"
        if more > 0
        else "<p class='muted more'></p>"
    )
    # Up to PAIR_ROWS rows: a scrolling box keeps the statistics table below in reach.
    return "<div class='scroll'>" + _table(_PAIR_COLS, rows, attrs=" data-kind='pairs'") + "</div>" + note


def _opt_ms(v: float | None) -> str:
    return _cell("-" if v is None else f"{v:,.3f}", "" if v is None else v)


def _pair_row(p: MemPair) -> str:
    return (
        "<tr>" + _cell(p.op, num=False) + _bytes(p.size) + _opt_ms(p.alloc_ms) + _opt_ms(p.release_ms)
        + _opt_ms(p.duration_ms) + "</tr>"
    )  # fmt: skip


def _stat_row(s: MemStat, row_id: str) -> str:
    return (
        f"<tr id='{row_id}'>" + _cell(s.name, num=False) + _cell(f"{s.calls:,}", s.calls) + _bytes(s.increase)
        + _bytes(s.self_increase) + _cell(f"{s.alloc_count:,}", s.alloc_count)
        + _cell(f"{s.self_alloc_count:,}", s.self_alloc_count) + _bytes(s.alloc_size)
        + _bytes(s.self_alloc_size) + "</tr>"
    )  # fmt: skip


def _categories_html(tl: CategoryTimeline, key: str, gap: PeakGap | None = None) -> str:
    times, stacks = thinned(tl)
    present = [i for i, _ in enumerate(tl.categories) if any(s[i] for s in stacks)]
    chart = stacked_area(
        times,
        [[s[i] for s in stacks] for i in present],
        [tl.categories[i] for i in present],
        f"{tl.device}: memory by category (ms)",
        (tl.peak_ms, tl.peak_bytes, f"peak {format_bytes(tl.peak_bytes)} at {tl.peak_ms:.3f} ms"),
    )
    at_peak = [
        "<tr>" + _cell(c, num=False) + _bytes(b) + "</tr>"
        for c, b in sorted(tl.peak_by_category.items(), key=lambda kv: -kv[1])
        if b
    ]
    none = TensorOrigin("", "", "")
    live = [
        "<tr>" + _cell(str(t), t) + _cell(str(v), v) + _cell(c, num=False) + _bytes(b)
        + _cell(o.operator or "-", num=False) + _cell(o.module or "-", num=False) + _cell(o.shape or "-", num=False)
        + "</tr>"
        for t, v, c, b in tl.live_at_peak
        for o in (tl.origins.get(t, none),)
    ]  # fmt: skip
    return (
        f"<div id='{escape(key, quote=True)}'><h4>Memory by category: {escape(tl.device)}</h4>{chart}"
        f"<p class='catpeak'>Peak {tl.peak_bytes:,} bytes ({format_bytes(tl.peak_bytes)}) at {tl.peak_ms:.3f} ms.</p>"
        + (f"<p class='peakwhy'>{escape(gap.reason)}</p>" if gap is not None else "")
        + _table(["category", "live at the peak"], at_peak, attrs=" data-kind='catpeak'")
        + _fold(
            f"{key}-live",
            f"Largest tensors live at the peak ({len(live):,})",
            _table(
                ["tensor id", "version", "category", "size", "operator", "module", "shape"],
                live,
                attrs=" data-kind='live'",
            ),
            len(live),
        )
        + "</div>"
    )


def stacked_area(
    xs: Sequence[float],
    layers: Sequence[Sequence[int]],
    names: Sequence[str],
    title: str,
    marker: tuple[float, int, str],
    width: int = 760,
    height: int = 280,
) -> str:
    """Layers stacked bottom-up over ``xs`` (a step at each x), the peak marked."""
    left, right, top, bottom = 80, 150, 28, 34
    pw, ph = width - left - right, height - top - bottom
    totals = [sum(layer[k] for layer in layers) for k in range(len(xs))]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y1 = max([*totals, 1]) * 1.05

    def sx(x: float) -> float:
        return left + (pw * (x - x0) / (x1 - x0) if x1 > x0 else pw / 2)

    def sy(y: float) -> float:
        return top + ph - ph * y / y1

    out = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        f'<text x="4" y="16" class="ttl">{escape(title)}</text>'
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>'
    ]
    for k in range(5):
        yv = y1 * k / 4
        out.append(
            f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end" class="tick">{escape(format_bytes(yv))}</text>'
        )
    for k in range(5):
        xv = x0 + (x1 - x0) * k / 4
        out.append(
            f'<text x="{sx(xv):.1f}" y="{top + ph + 16}" text-anchor="middle" class="tick">{xv:,.2f}</text>'
        )
    base = [0.0] * len(xs)
    for n, (name, layer) in enumerate(zip(names, layers, strict=False)):
        topline = [b + v for b, v in zip(base, layer, strict=False)]
        pts = []
        for k in range(len(xs)):  # steps: a value holds until the next x
            nx = xs[k + 1] if k + 1 < len(xs) else xs[k]
            pts += [(sx(xs[k]), sy(topline[k])), (sx(nx), sy(topline[k]))]
        bot = []
        for k in reversed(range(len(xs))):
            nx = xs[k + 1] if k + 1 < len(xs) else xs[k]
            bot += [(sx(nx), sy(base[k])), (sx(xs[k]), sy(base[k]))]
        colour = _CAT_COLOURS.get(name, svg.PALETTE[n % len(svg.PALETTE)])
        poly = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts + bot)
        out.append(
            f'<polygon points="{poly}" fill="{colour}" fill-opacity="0.8" stroke="none"><title>{escape(name)}</title></polygon>'
        )
        out.append(
            f'<rect x="{left + pw + 10}" y="{top + n * 18}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + pw + 24}" y="{top + n * 18 + 9}" class="lbl">{escape(name)}</text>'
        )
        base = topline
    mx, my, text = marker
    out.append(
        f'<circle cx="{sx(mx):.1f}" cy="{sy(my):.1f}" r="4" class="peak"><title>{escape(text)}</title></circle>'
        f'<text x="{min(sx(mx) + 6, left + pw - 4):.1f}" y="{max(sy(my) - 6, top + 10):.1f}" '
        f'text-anchor="{"end" if sx(mx) > left + pw * 0.7 else "start"}" class="peaklbl">{escape(text)}</text></svg>'
    )
    return "".join(out)


def _ops_html(
    rows: list[OpRow],
    title: str,
    what: str,
    device: bool,
    total: int,
    shapes: bool = False,
    key: str = "",
    row_ids: Sequence[str] = (),
    listed: int | None = None,
) -> str:
    cols = [what, "calls", "host self (ms)", "host total (ms)"]
    if device:
        cols += ["device self (ms)", "device total (ms)"]
    cols += ["self allocated", "allocated (incl.)", "self size increase", "size increase (incl.)"]
    if shapes:
        cols.append("input shapes (most frequent)")
    body: list[str] = []
    for k, r in enumerate(rows):
        cells = [_cell(r.name, num=False), _cell(f"{r.calls:,}", r.calls)]
        cells += [_cell(_ms(r.host_self_us), r.host_self_us), _cell(_ms(r.host_total_us), r.host_total_us)]
        if device:
            cells += [
                _cell(_ms(r.device_self_us), r.device_self_us),
                _cell(_ms(r.device_total_us), r.device_total_us),
            ]
        cells += [
            _bytes(r.self_alloc_bytes),
            _bytes(r.alloc_bytes),
            _bytes(r.self_increase),
            _bytes(r.increase),
        ]
        if shapes:
            cells.append(_cell("; ".join(f"{s} x{c}" for s, c in r.shapes), num=False))
        rid = f" id='{row_ids[k]}'" if k < len(row_ids) else ""
        body.append(f"<tr{rid}>" + "".join(cells) + "</tr>")
    kind = "ops" if shapes else "modules"
    first = len(rows) if listed is None else min(listed, len(rows))
    extra = len(rows) - first
    shown = (
        f"top {first} of {total:,} by host {'self' if shapes else 'total'} time"
        + (f", and {extra} more the overview names" if extra else "")
        if total > len(rows)
        else f"{total:,}"
    )
    return _fold(key, f"{title} ({shown})", _table(cols, body, attrs=f" data-kind='{kind}'"), len(body))


def _ranks_html(views: ProfilerViews) -> str:
    rows = [
        "<tr>" + _cell(str(r.rank), r.rank) + _cell(r.source, num=False) + _cell(_ms(r.step_us), r.step_us)
        + _cell(_ms(r.computation_us), r.computation_us) + _cell(_ms(r.overlap_us), r.overlap_us)
        + _cell(_ms(r.communication_us), r.communication_us) + _cell(_ms(r.other_us), r.other_us) + "</tr>"
        for r in views.ranks
    ]  # fmt: skip
    slow = views.slowest
    line = (
        f"<p class='slowest'>Slowest rank: {slow.rank} ({_ms(slow.step_us)} ms of profiled steps).</p>"
        if slow
        else ""
    )
    return (
        "<h3 id='ranks'>Computation and communication per rank</h3>" + line
        + _table(["rank", "from", "steps (ms)", "computation", "overlap", "communication", "other"], rows,
                 attrs=" data-kind='ranks'")
    )  # fmt: skip


_SCRIPT = asset("profiler.js")
