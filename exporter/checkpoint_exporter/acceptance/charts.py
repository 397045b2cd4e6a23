"""SVG line and bar charts, drawn here: the report is one file with no script and no asset.

A chart is data first (``Chart``, which the JSON report carries as is) and SVG second
(``to_svg``), so a reader of the JSON can redraw it with anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape

LINE, BAR = "line", "bar"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 150, 30, 40


@dataclass(frozen=True)
class Line:
    name: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Threshold:
    name: str
    value: float


@dataclass(frozen=True)
class Bar:
    category: str
    values: tuple[tuple[str, float], ...]  # (group, value): stacked in this order


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    unit: str  # seconds | bytes | count
    kind: str = LINE
    lines: tuple[Line, ...] = ()
    thresholds: tuple[Threshold, ...] = ()
    bars: tuple[Bar, ...] = ()
    note: str = ""
    domain: tuple[float, float] | None = None  # the time axis: the report's range

    @property
    def empty(self) -> bool:
        return not any(line.points for line in self.lines) and not self.bars

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "title": self.title,
            "unit": self.unit,
            "kind": self.kind,
            "series": [{"name": s.name, "points": [list(p) for p in s.points]} for s in self.lines],
            "thresholds": [{"name": t.name, "value": t.value} for t in self.thresholds],
            "bars": [{"category": b.category, "values": dict(b.values)} for b in self.bars],
            "note": self.note,
            "domain": list(self.domain) if self.domain else None,
        }


def format_value(value: float, unit: str) -> str:
    if unit == "bytes":
        for suffix, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if abs(value) >= size:
                return f"{value / size:.3g} {suffix}"
        return f"{value:.0f} B"
    if unit == "seconds":
        return f"{value:.3g}s"
    return f"{value:.3g}"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")


def _frame(chart: Chart, y_max: float, x_labels: Sequence[tuple[float, str]]) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<text class="title" x="{LEFT}" y="18">{escape(chart.title)}</text>',
        f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    for i in range(5):
        value = y_max * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(format_value(value, chart.unit))}</text>"
        )
    for x, label in x_labels:
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{TOP + plot_h + 16}" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    return parts


def _legend(names: Sequence[tuple[str, str, str]]) -> list[str]:
    """(name, colour, css class) entries to the right of the plot."""
    parts = []
    for i, (name, colour, css) in enumerate(names):
        y = TOP + 12 + 16 * i
        x = WIDTH - RIGHT + 12
        parts.append(
            f'<rect class="{css}" x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
        )
        parts.append(f'<text class="legend" x="{x + 15}" y="{y}">{escape(name)}</text>')
    return parts


def _line_svg(chart: Chart) -> list[str]:
    points = [p for line in chart.lines for p in line.points]
    t0, t1 = chart.domain or (min(t for t, _ in points), max(t for t, _ in points))
    if t1 <= t0:
        t1 = t0 + 1
    y_max = _nice_max(max([v for _, v in points] + [t.value for t in chart.thresholds]) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + plot_w * (t - t0) / (t1 - t0)

    def y(v: float) -> float:
        return TOP + plot_h - plot_h * min(v, y_max) / y_max

    ticks = [(x(t0 + (t1 - t0) * i / 4), _clock(t0 + (t1 - t0) * i / 4)) for i in range(5)]
    parts = _frame(chart, y_max, ticks)
    legend: list[tuple[str, str, str]] = []
    for i, line in enumerate(chart.lines):
        colour = PALETTE[i % len(PALETTE)]
        legend.append((line.name, colour, "key"))
        # A step line: a gauge holds its value until the next sample.
        path: list[str] = []
        previous: float | None = None
        for t, v in line.points:
            if previous is None:
                path.append(f"M{x(t):.1f},{y(v):.1f}")
            else:
                path.append(f"H{x(t):.1f}V{y(v):.1f}")
            previous = v
        if path:
            parts.append(
                f'<path class="series" d="{"".join(path)}" stroke="{colour}" fill="none">'
                f"<title>{escape(line.name)}</title></path>"
            )
    for i, threshold in enumerate(chart.thresholds):
        colour = PALETTE[i % len(PALETTE)] if len(chart.thresholds) > 1 else "#444"
        parts.append(
            f'<line class="threshold" x1="{LEFT}" x2="{LEFT + plot_w}" '
            f'y1="{y(threshold.value):.1f}" y2="{y(threshold.value):.1f}" stroke="{colour}">'
            f"<title>{escape(threshold.name)} {escape(format_value(threshold.value, chart.unit))}"
            "</title></line>"
        )
        if len(chart.thresholds) == 1:
            legend.append(
                (
                    f"{threshold.name} {format_value(threshold.value, chart.unit)}",
                    colour,
                    "key threshold-key",
                )
            )
    return parts + _legend(legend)


def _bar_svg(chart: Chart) -> list[str]:
    groups: list[str] = []
    for bar in chart.bars:
        for group, _ in bar.values:
            if group not in groups:
                groups.append(group)
    totals = [sum(v for _, v in bar.values) for bar in chart.bars]
    y_max = _nice_max(max(totals, default=1) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(chart.bars))
    labels = [(LEFT + slot * (i + 0.5), bar.category) for i, bar in enumerate(chart.bars)]
    parts = _frame(chart, y_max, labels)
    colours = {
        g: (
            "#2ca02c"
            if g == "succeeded"
            else "#d62728"
            if g == "failed"
            else PALETTE[i % len(PALETTE)]
        )
        for i, g in enumerate(groups)
    }
    for i, bar in enumerate(chart.bars):
        base = 0.0
        for group, value in bar.values:
            if value <= 0:
                continue
            top = base + value
            y0 = TOP + plot_h - plot_h * base / y_max
            y1 = TOP + plot_h - plot_h * top / y_max
            parts.append(
                f'<rect class="bar bar-{escape(group)}" x="{LEFT + slot * i + slot * 0.2:.1f}" '
                f'y="{y1:.1f}" width="{slot * 0.6:.1f}" height="{y0 - y1:.1f}" '
                f'fill="{colours[group]}"><title>{escape(bar.category)}: {value:g} {escape(group)}'
                "</title></rect>"
            )
            base = top
    return parts + _legend([(g, colours[g], "key") for g in groups])


def to_svg(chart: Chart) -> str:
    head = (
        f'<svg class="chart" data-chart="{escape(chart.key)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(chart.title)}">'
    )
    if chart.empty:
        body = [
            f'<text class="title" x="{LEFT}" y="18">{escape(chart.title)}</text>',
            f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
            "no data in the range</text>",
        ]
    else:
        draw: Callable[[Chart], list[str]] = _bar_svg if chart.kind == BAR else _line_svg
        body = draw(chart)
    return head + "".join(body) + "</svg>"


def line_chart(
    key: str,
    title: str,
    unit: str,
    series: dict[str, list],
    thresholds: Sequence[Threshold] = (),
    note: str = "",
    domain: tuple[float, float] | None = None,
) -> Chart:
    return Chart(
        key,
        title,
        unit,
        LINE,
        tuple(
            Line(name, tuple((float(t), float(v)) for t, v in points))
            for name, points in sorted(series.items())
        ),
        tuple(thresholds),
        note=note,
        domain=domain,
    )
