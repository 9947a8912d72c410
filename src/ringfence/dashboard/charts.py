"""Charts as inline SVG drawn here (no chart library, no build step): a line per series over time."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

W, H, PAD = 560, 120, 4


def line_chart(title: str, series: Sequence[tuple[str, Sequence[float], str]], left: str, right: str = "now",
               unit: str = "", totals: bool = True) -> Markup:
    """``series``: (name, values oldest first, css class). The y axis starts at 0 and ends at the largest value.
    The legend sums each series (``totals``) or gives its largest value (a gauge such as latency)."""
    peak = max((v for _, values, _ in series for v in values), default=0.0)
    top = peak or 1.0
    lines = []
    for name, values, css in series:
        n = max(len(values) - 1, 1)
        pts = " ".join(f"{PAD + i * (W - 2 * PAD) / n:.1f},{H - PAD - v / top * (H - 2 * PAD):.1f}"
                       for i, v in enumerate(values))
        lines.append(f'<polyline class="{css}" fill="none" points="{pts}"><title>{escape(name)}</title></polyline>')
    legend = " ".join(f'<span class="key {css}">{escape(name)} ({"total" if totals else "max"} '
                      f'{sum(values) if totals else max(values, default=0):g}{escape(unit)})</span>'
                      for name, values, css in series)
    return Markup(
        f'<figure class="chart"><figcaption>{escape(title)} <small>max {peak:g}{escape(unit)}</small></figcaption>'
        f'<svg viewBox="0 0 {W} {H}" preserveAspectRatio="none" role="img" aria-label="{escape(title)}">'
        f'<line class="axis" x1="0" y1="{H - PAD}" x2="{W}" y2="{H - PAD}"/>{"".join(lines)}</svg>'
        f'<div class="ticks"><span>{escape(left)}</span><span>{escape(right)}</span></div>'
        f'<div class="legend">{legend}</div></figure>')


def buckets(counts: dict[str, int], kind: str, now_minute: int, minutes: int, step: int,
            peak: bool = False) -> list[float]:
    """Per ``step`` minutes over the last ``minutes`` (oldest first): the sum of ``kind``, or its largest value
    (``peak``: a gauge such as latency)."""
    out = []
    start = now_minute - minutes + 1
    for b in range(start, now_minute + 1, step):
        values = [counts.get(f"{kind}{m}", 0) for m in range(b, min(b + step, now_minute + 1))]
        out.append(float(max(values, default=0) if peak else sum(values)))
    return out
