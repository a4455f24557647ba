"""Charts drawn on the server as inline SVG: no script, no CDN, readable offline."""

from __future__ import annotations

from typing import Optional, Sequence

from markupsafe import escape

__all__ = ["Series", "line_chart"]

Series = tuple[str, str, Sequence[Optional[float]]]  # (name, css class, one value per x label)

_W, _H = 560, 180
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 14, 26


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10
    for mult in (1, 2, 2.5, 5, 10):
        if value <= step * mult:
            return step * mult
    return value


def _fmt(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def line_chart(title: str, labels: Sequence[str], series: Sequence[Series], unit: str = "") -> str:
    """An SVG line chart of ``series`` over ``labels`` (hours); gaps where a value is None."""
    n = len(labels)
    values = [v for _, _, vs in series for v in vs if v is not None]
    top = _nice_max(max(values, default=0.0))
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(i: int) -> float:
        return _LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return _TOP + plot_h * (1 - v / top)

    parts = [f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>"]
    for k in range(5):
        v = top * k / 4
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        parts.append(f'<text class="axis" x="{_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                     f'{_fmt(v)}{escape(unit)}</text>')
    for i in range(0, n, max(1, n // 6)):
        parts.append(f'<text class="axis" x="{x(i):.1f}" y="{_H - 8}" text-anchor="middle">{escape(labels[i])}</text>')
    for name, css, vs in series:
        run: list[str] = []
        for i, v in enumerate(vs):
            if v is None:
                if run:
                    parts.append(_polyline(run, css))
                run = []
                continue
            run.append(f"{x(i):.1f},{y(v):.1f}")
        if run:
            parts.append(_polyline(run, css))
    legend_x = _LEFT
    for name, css, _ in series:
        parts.append(f'<rect class="swatch {escape(css)}" x="{legend_x}" y="2" width="10" height="8"/>')
        parts.append(f'<text class="legend" x="{legend_x + 14}" y="10">{escape(name)}</text>')
        legend_x += 14 + 7 * len(name) + 16
    parts.append("</svg>")
    return "".join(parts)


def _polyline(points: list[str], css: str) -> str:
    if len(points) == 1:
        px, py = points[0].split(",")
        return f'<circle class="dot {escape(css)}" cx="{px}" cy="{py}" r="2.5"/>'
    return f'<polyline class="line {escape(css)}" points="{" ".join(points)}"/>'
