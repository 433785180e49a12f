"""Hand-written inline SVG charts: no script, no font or library to fetch, so a report renders offline."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

#: Colour per series (colour-blind-safe palette, Okabe-Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")

Fmt = Callable[[float], str]

#: A line chart needs this many points in some series; with fewer, its figures are a table.
MIN_POINTS = 3


def hbar_chart(rows: Sequence[tuple[str, float, int]], fmt: Fmt, title: str, width: int = 760) -> str:
    """Horizontal bars, one per ``(label, value, colour index)``, with the value printed at the bar's end."""
    bar_h, gap, label_w, value_w = 18, 6, 240, 90
    height = 28 + len(rows) * (bar_h + gap) + 4
    vmax = max([v for _, v, _ in rows] + [1])
    plot_w = width - label_w - value_w
    out = [_open(width, height, title)]
    for i, (label, value, colour) in enumerate(rows):
        y = 28 + i * (bar_h + gap)
        w = max(1.0, plot_w * value / vmax) if value > 0 else 0.0
        out.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 5}" text-anchor="end" class="lbl">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{PALETTE[colour % len(PALETTE)]}">'
            f"<title>{escape(label)}: {escape(fmt(value))}</title></rect>"
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 5}" class="val">{escape(fmt(value))}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    fmt: Fmt,
    title: str,
    x_labels: Sequence[str] | None = None,
    marker: tuple[float, float, str] | None = None,
    width: int = 760,
    height: int = 260,
    bands: Sequence[Sequence[tuple[float, float, float]]] | None = None,
    integer_x: bool = False,
    from_zero: bool = False,
) -> str:
    """Lines through ``(x, y)`` points, one per named series, with a y axis in ``fmt`` units.

    ``x_labels[i]`` names ``x == i`` (calls); without it the x axis shows the x values (trace
    entries). ``marker`` ``(x, y, text)`` draws a labelled dot, e.g. the peak. ``bands[n]``
    holds ``(x, low, high)`` for series ``n``: a shaded band around its line (binned calls).
    ``integer_x``: x is a count (call numbers): ticks only at whole numbers, each once.
    ``from_zero``: the y axis starts at zero however far from it the values are (a device's
    memory, where the height above zero is what fits); otherwise values far from zero (host
    RSS) are zoomed in on.

    Series of fewer than :data:`MIN_POINTS` points each draw no line worth reading: they come
    back as a table of the points (see :func:`points_table`).
    """
    if series and all(len(s) < MIN_POINTS for _, s in series):
        return points_table(series, fmt, title, x_labels)
    left, right, top, bottom = 80, 150, 28, 34
    band_pts = [(x, y) for bs in bands or () for x, lo, hi in bs for y in (lo, hi)]
    pts = [p for _, s in series for p in s] + band_pts
    xs = [p[0] for p in pts] or [0.0]
    ys = [p[1] for p in pts] or [0.0]
    x0, x1 = min(xs), max(xs)
    lo, hi = min(ys), max(ys)
    if lo > 0.3 * hi and not from_zero:
        # Values far from zero (host RSS): zoom in, or every line is flat at the top.
        pad = (hi - lo) * 0.1 or hi * 0.05 or 1.0
        y0, y1 = max(0.0, lo - pad), hi + pad
    else:
        y0, y1 = min(0.0, lo), max(hi, 1.0) * 1.05
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (pw * (x - x0) / (x1 - x0) if x1 > x0 else pw / 2)

    def sy(y: float) -> float:
        return top + ph - ph * (y - y0) / (y1 - y0)

    out = [_open(width, height, title)]
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>')
    for k in range(5):
        yv = y0 + (y1 - y0) * k / 4
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" class="grid"/>'
            f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end" class="tick">{escape(fmt(yv))}</text>'
        )
    if x_labels:
        step = max(1, len(x_labels) // 8)
        for i in range(0, len(x_labels), step):
            out.append(
                f'<text x="{sx(i):.1f}" y="{top + ph + 16}" text-anchor="middle" class="tick">{escape(x_labels[i])}</text>'
            )
    elif integer_x:
        for tick in integer_ticks(x0, x1):
            out.append(
                f'<text x="{sx(tick):.1f}" y="{top + ph + 16}" text-anchor="middle" class="tick">{tick:,}</text>'
            )
    else:
        for k in range(5):
            xv = x0 + (x1 - x0) * k / 4
            out.append(
                f'<text x="{sx(xv):.1f}" y="{top + ph + 16}" text-anchor="middle" class="tick">{xv:,.0f}</text>'
            )
    for n, (name, s) in enumerate(series):
        colour = PALETTE[n % len(PALETTE)]
        band = bands[n] if bands is not None and n < len(bands) else ()
        if any(lo < hi for _, lo, hi in band):
            edge = [f"{sx(x):.1f},{sy(hi):.1f}" for x, _, hi in band]
            edge += [f"{sx(x):.1f},{sy(lo):.1f}" for x, lo, _ in reversed(band)]
            out.append(
                f'<polygon points="{" ".join(edge)}" fill="{colour}" fill-opacity="0.22" stroke="none"/>'
            )
        if len(s) == 1:
            x, y = s[0]
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
        elif s:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        out.append(
            f'<rect x="{left + pw + 10}" y="{top + n * 18}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + pw + 24}" y="{top + n * 18 + 9}" class="lbl">{escape(name)}</text>'
        )
    if marker is not None:
        mx, my, text = marker
        out.append(
            f'<circle cx="{sx(mx):.1f}" cy="{sy(my):.1f}" r="4" class="peak"><title>{escape(text)}</title></circle>'
            f'<text x="{min(sx(mx) + 6, left + pw - 4):.1f}" y="{max(sy(my) - 6, top + 10):.1f}" '
            f'text-anchor="{"end" if sx(mx) > left + pw * 0.7 else "start"}" class="peaklbl">{escape(text)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def points_table(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    fmt: Fmt,
    title: str,
    x_labels: Sequence[str] | None = None,
) -> str:
    """The points of a line chart as a table: one row per point, under the chart's title."""
    rows = []
    for name, s in series:
        for x, y in s:
            xs = (
                x_labels[int(x)]
                if x_labels and 0 <= int(x) < len(x_labels)
                else (f"{x:,.0f}" if float(x).is_integer() else f"{x:,.3f}")
            )
            rows.append(
                f"<tr><td>{escape(name)}</td><td class='n'>{escape(xs)}</td><td class='n'>{escape(fmt(y))}</td></tr>"
            )
    return (
        f"<div class='plot-table' role='figure' aria-label='{escape(title, quote=True)}'>"
        f"<p><b>{escape(title)}</b></p><table><thead><tr><th>series</th><th>at</th><th>value</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def integer_ticks(x0: float, x1: float, most: int = 8) -> list[int]:
    """Whole numbers from ``x0`` to ``x1`` at a step of 1, 2 or 5 times a power of ten, at most
    ``most`` of them: call numbers 2 and 3 get the ticks ``2 3``, never ``2 2 2 3 3``.

    Example:
        >>> integer_ticks(2, 3)
        [2, 3]
        >>> integer_ticks(1, 100)
        [20, 40, 60, 80, 100]
    """
    lo, hi = math.ceil(x0), math.floor(x1)
    if hi < lo:
        return []
    step = 1
    while (hi - lo) // step + 1 > most:
        step = _next_step(step)
    first = math.ceil(lo / step) * step
    return list(range(first, hi + 1, step))


def _next_step(step: int) -> int:
    """1, 2, 5, 10, 20, 50, ..."""
    return step * 5 // 2 if str(step)[0] == "2" else step * 2


def _open(width: int, height: int, title: str) -> str:
    return (
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        f'<text x="4" y="16" class="ttl">{escape(title)}</text>'
    )


def stacked_hbars(
    rows: Sequence[tuple[str, int, Sequence[tuple[str, int, str, str]]]],
    fmt: Fmt,
    title: str,
    width: int = 760,
) -> str:
    """One horizontal bar per ``(label, total, parts)``, made of its parts end to end.

    Each part is ``(key, value, colour, name)``; a row's parts are expected to add up to its
    total, which is printed at the bar's end. Every bar is drawn to one scale (the largest
    total), and each part carries ``data-part`` and ``data-bytes`` so a test can sum them.
    """
    bar_h, gap, label_w, value_w = 20, 8, 200, 90
    height = 28 + len(rows) * (bar_h + gap) + 4
    vmax = max([t for _, t, _ in rows] + [1])
    plot_w = width - label_w - value_w
    out = [_open(width, height, title)]
    for i, (label, total, parts) in enumerate(rows):
        y = 28 + i * (bar_h + gap)
        out.append(
            f'<g class="sbar" data-label="{escape(label, quote=True)}" data-total="{total}">'
            f'<text x="{label_w - 6}" y="{y + bar_h - 6}" text-anchor="end" class="lbl">{escape(label)}</text>'
        )
        x = float(label_w)
        for key, value, colour, name in parts:
            w = plot_w * value / vmax
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{colour}" '
                f'data-part="{escape(key, quote=True)}" data-bytes="{value}">'
                f"<title>{escape(name)}: {escape(fmt(value))}</title></rect>"
            )
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + bar_h - 6}" class="val">{escape(fmt(total))}</text></g>')
    out.append("</svg>")
    return "".join(out)
