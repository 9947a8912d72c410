"""Charts as inline SVG drawn here (no chart library, no build step): a line per series over time."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from markupsafe import Markup

W, H, PAD = 560, 120, 4


def line_chart(title: str, series: Sequence[tuple[str, Sequence[float], str]], left: str, right: str = "now",
               unit: str = "", totals: bool = True, labels: Sequence[str] | None = None) -> Markup:
    """``series``: (name, values oldest first, css class). The y axis starts at 0 and ends at the largest value
    (1 when every value is 0, so the axis still has two ends), both written beside it. The legend sums each
    series (``totals``) or gives its largest value (a gauge such as latency). ``labels``: each point's time;
    hovering a point's column shows it with every series' value."""
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
    mid = labels[len(labels) // 2] if labels else ""
    return Markup(
        f'<figure class="chart"><figcaption>{escape(title)} <small>max {peak:g}{escape(unit)}</small></figcaption>'
        f'<div class="plot"><div class="yaxis"><span>{top:g}{escape(unit)}</span><span>0</span></div>'
        f'<svg viewBox="0 0 {W} {H}" preserveAspectRatio="none" role="img" aria-label="{escape(title)}">'
        f'<line class="grid" x1="0" y1="{H / 2}" x2="{W}" y2="{H / 2}"/>'
        f'<line class="axis" x1="0" y1="{H - PAD}" x2="{W}" y2="{H - PAD}"/>{"".join(lines)}'
        f'{_hover(series, labels, unit)}</svg></div>'
        f'<div class="ticks"><span>{escape(labels[0] if labels else left)}</span><span>{escape(mid)}</span>'
        f'<span>{escape(labels[-1] if labels else right)}</span></div>'
        f'<div class="legend">{legend}</div></figure>')


def _hover(series: Sequence[tuple[str, Sequence[float], str]], labels: Sequence[str] | None, unit: str) -> str:
    """A transparent column per point whose tooltip gives its time and every series' value there."""
    n = max((len(v) for _, v, _ in series), default=0)
    if not n:
        return ""
    width = W / n
    cols = []
    for i in range(n):
        when = labels[i] if labels and i < len(labels) else f"point {i + 1}"
        values = ", ".join(f"{name} {v[i]:g}{unit}" for name, v, _ in series if i < len(v))
        cols.append(f'<rect class="hover" x="{i * width:.1f}" y="0" width="{width:.1f}" height="{H}">'
                    f'<title>{escape(when)}: {escape(values)}</title></rect>')
    return "".join(cols)


def minute_labels(now_minute: int, minutes: int, step: int) -> list[str]:
    """The UTC time each bucket of ``buckets`` starts at (HH:MM)."""
    start = now_minute - minutes + 1
    return [datetime.fromtimestamp(m * 60, UTC).strftime("%H:%M") for m in range(start, now_minute + 1, step)]


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
