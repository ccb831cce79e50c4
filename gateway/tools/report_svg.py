"""Inline SVG plots for ``gateway report``'s page: a time-series line chart and horizontal
(stacked) bars. Pure functions from numbers to markup, no JavaScript and no fonts to fetch,
so the page renders offline. Every drawn datum (a line, a point, a bar) has class ``mark``
and a ``<title>`` (the browser's tooltip); the page's script checks that marks drew.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from html import escape

__all__ = ["PALETTE", "bars", "legend", "lines", "nice_ticks"]

#: Series colours, in order (colour-blind-safe, after Okabe and Ito).
PALETTE = ("#0072b2", "#e69f00", "#d55e00", "#009e73", "#cc79a7", "#56b4e9", "#999999")

Format = Callable[[float], str]

_W, _H = 720, 230                       # line chart viewBox (px)
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 30, 10, 26
_TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                 43200, 86400, 172800, 604800)


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Ticks 0, step, ... up to at least ``top``, the step 1, 2, 2.5 or 5 x 10^k."""
    if not top > 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _number(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def _clock(span_s: float) -> Callable[[float], str]:
    pattern = "%H:%M" if span_s >= 3600 else "%H:%M:%S"
    if span_s >= 2 * 86400:
        pattern = "%m-%d %H:%M"
    return lambda t: datetime.fromtimestamp(t, UTC).strftime(pattern)


def _time_ticks(x0: float, x1: float) -> list[float]:
    """At most 6 round times (multiples of 1 s ... 1 day) within [x0, x1]."""
    step = next((s for s in _TIME_STEPS_S if (x1 - x0) / s <= 5), _TIME_STEPS_S[-1])
    first = math.ceil(x0 / step) * step
    return [first + i * step for i in range(int((x1 - first) // step) + 1)]


def _svg(label: str, height: int) -> str:
    return (f'<svg class="plot" viewBox="0 0 {_W} {height}" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">')


def legend(names: Sequence[str]) -> str:
    """An HTML legend: a coloured swatch and the name of each series, in palette order."""
    items = "".join(f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>'
                    f"{escape(name)}</span>" for i, name in enumerate(names))
    return f'<div class="legend">{items}</div>'


def lines(label: str, xs: Sequence[float], series: Sequence[tuple[str, Sequence[float | None]]],
          fmt: Format = _number, step_s: float = 1.0) -> str:
    """A line chart of ``series`` (name, one value or None per x) over times ``xs`` (epoch s,
    ascending; buckets ``step_s`` wide): a point per value, a line through consecutive ones.
    ``label`` names the plot for screen readers; ``fmt`` formats the y values."""
    x0, x1 = (xs[0], xs[-1]) if xs else (0.0, 1.0)
    if x1 <= x0:
        x0, x1 = x0 - step_s / 2, x1 + step_s / 2
    values = [v for _, vs in series for v in vs if v is not None]
    ticks = nice_ticks(max(values, default=0.0))
    top = ticks[-1]
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(t: float) -> float:
        return _LEFT + (t - x0) / (x1 - x0) * width

    def py(v: float) -> float:
        return _TOP + height - v / top * height

    clock = _clock(x1 - x0)
    parts = [_svg(label, _H)]
    for tick in ticks:
        y = py(tick)
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" '
                     f'y2="{y:.1f}"/><text class="axis" x="{_LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{escape(fmt(tick))}</text>')
    for t in _time_ticks(x0, x1):
        parts.append(f'<text class="axis" x="{px(t):.1f}" y="{_H - 8}" '
                     f'text-anchor="middle">{clock(t)}</text>')
    for i, (name, vs) in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        path: list[str] = []
        dots: list[str] = []
        previous = False
        for t, v in zip(xs, vs):
            if v is None:
                previous = False
                continue
            x, y = px(t), py(v)
            path.append(f"{'L' if previous else 'M'}{x:.1f} {y:.1f}")
            previous = True
            dots.append(f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="2.5">'
                        f"<title>{clock(t)} {escape(name)}: {escape(fmt(v))}</title></circle>")
        if path:
            parts.append(f'<g fill="{colour}" stroke="{colour}"><path class="mark" fill="none" '
                         f'stroke-width="1.8" d="{" ".join(path)}"/>{"".join(dots)}</g>')
    parts.append("</svg>")
    return "".join(parts)


def bars(label: str, rows: Sequence[tuple[str, Sequence[float]]], names: Sequence[str],
         fmt: Format = _number, total_fmt: Format | None = None) -> str:
    """Horizontal bars, one per (label, values) row, each value a segment stacked left to
    right in palette order (``names`` names the segments); the row's total is written after
    its bar with ``total_fmt`` (default ``fmt``)."""
    label_w, value_w, row_h = 190, 90, 24
    bar_w = _W - label_w - value_w
    top = max((sum(vs) for _, vs in rows), default=0.0) or 1.0
    height = row_h * len(rows) + 8
    parts = [_svg(label, height)]
    for r, (name, vs) in enumerate(rows):
        y = 4 + r * row_h
        shown = name if len(name) <= 28 else name[:27] + "…"
        parts.append(f'<text class="axis" x="{label_w - 8}" y="{y + 16}" text-anchor="end">'
                     f"<title>{escape(name)}</title>{escape(shown)}</text>")
        x = float(label_w)
        for i, v in enumerate(vs):
            w = v / top * bar_w
            if w > 0:
                parts.append(f'<rect class="mark" x="{x:.1f}" y="{y + 3}" width="{max(w, 1):.1f}" '
                             f'height="{row_h - 6}" fill="{PALETTE[i % len(PALETTE)]}">'
                             f"<title>{escape(name)} · {escape(names[i])}: "
                             f"{escape(fmt(v))}</title></rect>")
            x += w
        parts.append(f'<text class="value" x="{x + 6:.1f}" y="{y + 16}">'
                     f"{escape((total_fmt or fmt)(sum(vs)))}</text>")
    parts.append("</svg>")
    return "".join(parts)
