"""Charts as standalone SVG documents (no dependencies): horizontal bars, and lines over time.

Each bar may carry a whisker (the range of its repeats) and a caption; a
dashed line marks a reference value (the baseline)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

_WIDTH = 820
_LABEL_W = 190
_CAPTION_W = 190
_ROW_H = 30
_TOP = 84
_BOTTOM = 36
_BAR_COLOR = "#4c78a8"
_MUTED = "#9aa5b1"


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None  # None: nothing measured (drawn as a note)
    caption: str = ""
    low: float | None = None
    high: float | None = None


def _nice_max(value: float) -> float:
    """A round axis end at or above ``value`` (1, 2 or 5 times a power of ten)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def bar_chart(title: str, subtitle: str, bars: Sequence[Bar], *, unit: str, reference: float | None = None) -> str:
    plot_w = _WIDTH - _LABEL_W - _CAPTION_W
    height = _TOP + _ROW_H * max(len(bars), 1) + _BOTTOM
    top_value = max([b.high or b.value or 0.0 for b in bars] + [reference or 0.0])
    axis_max = _nice_max(top_value * 1.02)

    def x(value: float) -> float:
        return _LABEL_W + plot_w * value / axis_max

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        f'<text x="12" y="24" font-size="16" font-weight="bold">{escape(title)}</text>',
    ]
    out += [
        f'<text x="12" y="{42 + 16 * i}" fill="#555" font-size="12">{escape(line)}</text>'
        for i, line in enumerate(subtitle.splitlines())
    ]
    bottom = _TOP + _ROW_H * len(bars)
    for i in range(6):  # grid and axis labels
        value = axis_max * i / 5
        gx = x(value)
        out.append(f'<line x1="{gx:.1f}" y1="{_TOP - 6}" x2="{gx:.1f}" y2="{bottom}" stroke="#eee"/>')
        out.append(f'<text x="{gx:.1f}" y="{bottom + 16}" text-anchor="middle" fill="#777">{value:g}</text>')
    centre = _LABEL_W + plot_w / 2
    out.append(f'<text x="{centre:.1f}" y="{bottom + 32}" text-anchor="middle" fill="#777">{escape(unit)}</text>')
    for i, bar in enumerate(bars):
        y = _TOP + i * _ROW_H
        mid = y + _ROW_H / 2
        out.append(f'<text x="{_LABEL_W - 8}" y="{mid + 4:.1f}" text-anchor="end">{escape(bar.label)}</text>')
        if bar.value is None:
            out.append(f'<text x="{_LABEL_W + 4}" y="{mid + 4:.1f}" fill="{_MUTED}">{escape(bar.caption)}</text>')
            continue
        out.append(
            f'<rect x="{_LABEL_W}" y="{y + 6}" width="{max(x(bar.value) - _LABEL_W, 1):.1f}" '
            f'height="{_ROW_H - 12}" fill="{_BAR_COLOR}"/>'
        )
        if bar.low is not None and bar.high is not None:
            lo, hi = x(bar.low), x(bar.high)
            out.append(f'<line x1="{lo:.1f}" y1="{mid:.1f}" x2="{hi:.1f}" y2="{mid:.1f}" stroke="#222"/>')
            for end in (lo, hi):
                out.append(f'<line x1="{end:.1f}" y1="{mid - 5:.1f}" x2="{end:.1f}" y2="{mid + 5:.1f}" stroke="#222"/>')
        out.append(f'<text x="{_WIDTH - _CAPTION_W + 8}" y="{mid + 4:.1f}">{escape(bar.caption)}</text>')
    if reference:
        rx = x(reference)
        out.append(
            f'<line x1="{rx:.1f}" y1="{_TOP - 6}" x2="{rx:.1f}" y2="{bottom}" stroke="#d62728" stroke-dasharray="4 3"/>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac")


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]  # (x, y), in x order


def line_chart(
    title: str,
    subtitle: str,
    series: Sequence[Series],
    *,
    unit: str,
    x_label: Callable[[float], str] = lambda x: f"{x:g}",
) -> str:
    """Lines over a shared x axis (time, say), a legend on the right; a series
    of one point is drawn as a dot."""
    left, right, top, plot_h = 60, 200, 70, 300
    plot_w = _WIDTH - left - right
    height = top + plot_h + 50
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    x_span = (x1 - x0) or 1.0
    y_max = _nice_max(max(ys, default=0.0) * 1.05)

    def px(x: float) -> float:
        return left + plot_w * (x - x0) / x_span if x1 > x0 else left + plot_w / 2

    def py(y: float) -> float:
        return top + plot_h - plot_h * y / y_max

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        f'<text x="12" y="24" font-size="16" font-weight="bold">{escape(title)}</text>',
        f'<text x="12" y="44" fill="#555" font-size="12">{escape(subtitle)}</text>',
    ]
    for i in range(6):
        value = y_max * i / 5
        gy = py(value)
        out.append(f'<line x1="{left}" y1="{gy:.1f}" x2="{left + plot_w}" y2="{gy:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{gy + 4:.1f}" text-anchor="end" fill="#777">{value:g}</text>')
    for i in range(5):
        x = x0 + x_span * i / 4 if x1 > x0 else x0
        out.append(
            f'<text x="{px(x):.1f}" y="{top + plot_h + 18}" text-anchor="middle" fill="#777" '
            f'font-size="11">{escape(x_label(x))}</text>'
        )
        if x1 == x0:
            break
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 38}" text-anchor="middle" fill="#777">'
        f"{escape(unit)}</text>"
    )
    for n, s in enumerate(series):
        color = _PALETTE[n % len(_PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        if len(s.points) > 1:
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>' for x, y in s.points]
        ly = top + 8 + n * 18
        out.append(f'<rect x="{_WIDTH - right + 16}" y="{ly - 9}" width="12" height="4" fill="{color}"/>')
        out.append(f'<text x="{_WIDTH - right + 34}" y="{ly - 3}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
