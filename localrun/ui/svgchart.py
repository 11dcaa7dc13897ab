"""A horizontal bar chart as a standalone SVG document (no dependencies).

Each bar may carry a whisker (the range of its repeats) and a caption; a
dashed line marks a reference value (the baseline)."""

from __future__ import annotations

import math
from collections.abc import Sequence
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
