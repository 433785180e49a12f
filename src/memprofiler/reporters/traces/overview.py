"""The overview at the top of the profiler views: per trace the step time split, the peak of each
device, and the top operators by memory and by time, each line linking to the row or table that
holds it further down (where the tables are folded, see :mod:`~memprofiler.reporters.traces.html`).

The ids of those targets are made here, by one function each, so the links and the tables
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from memprofiler.analysis.traces.ops import OpRow
from memprofiler.analysis.traces.steps import STEP_PARTS
from memprofiler.analysis.traces.views import ProfilerViews, TraceView
from memprofiler.reporters.parts import svg
from memprofiler.reporters.parts.assets import asset
from memprofiler.units import format_bytes

#: Operators listed per "top" list of the overview.
TOP_OPS = 5
#: Colours of the step parts (kernel, memcpy, memset, runtime, data loading, host compute, other).
STEP_COLOURS = ("#0072B2", "#56B4E9", "#009E73", "#E69F00", "#CC79A7", "#D55E00", "#999999")


def steps_id(n: int) -> str:
    return f"steps-{n}"


def memory_id(n: int, d: int) -> str:
    """The memory view of device ``d`` of trace ``n`` (the range selection's ``div.memview``)."""
    return f"mem-{n}-{d}"


def stats_id(n: int, d: int) -> str:
    return f"mem-{n}-{d}-stats"


def stat_row_id(n: int, d: int, k: int) -> str:
    return f"mem-{n}-{d}-stat-{k}"


def categories_id(n: int, c: int) -> str:
    return f"cats-{n}-{c}"


def ops_id(n: int) -> str:
    return f"ops-{n}"


def op_row_id(n: int, k: int) -> str:
    return f"op-{n}-{k}"


def modules_id(n: int) -> str:
    return f"modules-{n}"


def top_by_time(tv: TraceView, n: int = TOP_OPS) -> list[tuple[str, Callable[[OpRow], float], list[int]]]:
    """``(what, its time of a row, indexes into tv.ops)``: the operators with the most host self
    time and, where the trace has device time, the most device self time."""
    times: list[tuple[str, Callable[[OpRow], float]]] = [("host self time", lambda r: r.host_self_us)]
    if tv.has_device_time:
        times.append(("device self time", lambda r: r.device_self_us))
    return [(what, key, _top(tv.ops, key, n)) for what, key in times]


def _top(rows: list[OpRow], key: Callable[[OpRow], float], n: int) -> list[int]:
    ranked = sorted(range(len(rows)), key=lambda i: (-key(rows[i]), rows[i].name))
    return [i for i in ranked[:n] if key(rows[i]) > 0]


def shown_ops(tv: TraceView, top: int) -> list[int]:
    """Indexes of the operators the operator table shows: the first ``top`` (by host self time,
    the reader's order), then any the overview links to that are not among them."""
    shown = list(range(min(top, len(tv.ops))))
    for _, _, idx in top_by_time(tv):
        shown += [i for i in idx if i not in shown]
    return shown


def overview_html(views: ProfilerViews) -> str:
    """One block per trace, before any table."""
    if not views.traces:
        return ""
    blocks = [_trace_overview(tv, n, len(views.traces) > 1) for n, tv in enumerate(views.traces)]
    return "<div id='profiler-overview'><h3>Overview</h3>" + "".join(blocks) + "</div>"


def _link(target: str, text: str, table: str = "") -> str:
    """A link to an id below; ``table``: where to go when that id is gone (a redrawn row)."""
    fallback = f" data-table='{escape(table, quote=True)}'" if table else ""
    return f"<a class='pv-link' href='#{escape(target, quote=True)}'{fallback}>{text}</a>"


def _ms(us: float) -> str:
    return f"{us / 1000:,.3f} ms"


def _trace_overview(tv: TraceView, n: int, several: bool) -> str:
    rank = "" if tv.rank is None else f" · rank {tv.rank}"
    out = [
        f"<h4>{escape(tv.title)}{rank}</h4>" if several else f"<p class='muted'>{escape(tv.title)}{rank}</p>"
    ]
    out.append(_steps_overview(tv, n))
    out.append(_peaks_overview(tv, n))
    out.append("<div class='pv-tops'>" + _memory_tops(tv, n) + _time_tops(tv, n) + "</div>")
    return f"<div class='pv-trace' id='overview-{n}'>" + "".join(out) + "</div>"


def _steps_overview(tv: TraceView, n: int) -> str:
    if not tv.steps:
        return ""
    total = sum(s.total_us for s in tv.steps)
    sums = {p: sum(s.parts.get(p, 0.0) for s in tv.steps) for p in STEP_PARTS}
    parts = [(p, v) for p, v in sums.items() if v > 0]
    bar = svg.stacked_hbars(
        [
            (
                f"{len(tv.steps)} step{'s' if len(tv.steps) != 1 else ''}",
                round(total),
                [(p, round(v), STEP_COLOURS[STEP_PARTS.index(p)], p) for p, v in parts],
            )
        ],
        _ms,
        "step time split",
        width=620,
    )
    words = ", ".join(
        f"{escape(p)} {v / total:.0%}" for p, v in sorted(parts, key=lambda kv: -kv[1]) if total
    )
    return (
        f"<p><b>Step time</b>: {_ms(total)} over {len(tv.steps):,} step(s): {words}. "
        f"{_link(steps_id(n), 'per step')}</p>{bar}"
    )


def _peaks_overview(tv: TraceView, n: int) -> str:
    rows = []
    for d, dv in enumerate(tv.devices):
        m = dv.memory
        rows.append(
            f"<tr><td>{_link(memory_id(n, d), escape(m.device))}</td><td>allocator's memory events</td>"
            f"<td class=n>{escape(format_bytes(m.peak_allocated))}</td><td class=n>{escape(format_bytes(m.peak_reserved))}</td>"
            f"<td class=n>{m.peak_ms:,.3f}</td></tr>"
        )
    for c, tl in enumerate(tv.categories):
        rows.append(
            f"<tr><td>{_link(categories_id(n, c), escape(tl.device))}</td><td>memory timeline (by category)</td>"
            f"<td class=n>{escape(format_bytes(tl.peak_bytes))}</td><td class=n>-</td><td class=n>{tl.peak_ms:,.3f}</td></tr>"
        )
    if not rows:
        return ""
    head = (
        "<tr><th>device</th><th>from</th><th>peak allocated</th><th>peak reserved</th><th>at (ms)</th></tr>"
    )
    why = "".join(f"<p class='peakwhy'>{escape(g.device)}: {escape(g.reason)}</p>" for g in tv.peak_gaps)
    return (
        f"<p><b>Peak per device</b></p><table class='pv-peaks'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
        + why
    )


def _memory_tops(tv: TraceView, n: int) -> str:
    """Per device, the operators that allocated the most themselves (their own allocations, not
    their children's), each linking to its row of that device's statistics table."""
    out = []
    for d, dv in enumerate(tv.devices):
        ranked = sorted(range(len(dv.stats)), key=lambda k: (-dv.stats[k].self_alloc_size, dv.stats[k].name))
        items = [
            f"<li>{_link(stat_row_id(n, d, k), escape(dv.stats[k].name), stats_id(n, d))} "
            f"<span class='muted'>{escape(format_bytes(dv.stats[k].self_alloc_size))}</span></li>"
            for k in ranked[:TOP_OPS]
            if dv.stats[k].self_alloc_size > 0
        ]
        if items:
            out.append(
                f"<div><p><b>Top operators by memory</b>, {escape(dv.memory.device)} "
                f"(bytes they allocated themselves; {_link(stats_id(n, d), 'table')})</p><ol>{''.join(items)}</ol></div>"
            )
    return "".join(out)


def _time_tops(tv: TraceView, n: int) -> str:
    out = []
    for what, get, idx in top_by_time(tv):
        items = [
            f"<li>{_link(op_row_id(n, i), escape(tv.ops[i].name))} <span class='muted'>{_ms(get(tv.ops[i]))}</span></li>"
            for i in idx
        ]
        if items:
            out.append(
                f"<div><p><b>Top operators by {escape(what)}</b> ({_link(ops_id(n), 'table')})</p>"
                f"<ol>{''.join(items)}</ol></div>"
            )
    return "".join(out)


#: Opens the folded sections on the way to a link's target and shows it: a click on an overview
#: link, or a page opened at ``#target``. A target gone from a table (a range selection redrew
#: its rows) falls back to the table.
SCRIPT = asset("profiler_overview.js")

CSS = asset("profiler_overview.css")
