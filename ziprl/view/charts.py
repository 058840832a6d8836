"""Geometry of the run charts (reward and Q_com over steps, level distribution), drawn as inline SVG by the page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LEVEL_COLORS = ("#1b9e77", "#66a61e", "#e6ab02", "#d95f02", "#7570b3")
SERIES_COLORS = {"reward": "#1f77b4", "Q_com": "#d62728"}
WIDTH, HEIGHT, PAD, LEGEND = 640, 200, 36, 80  # LEGEND: room right of the plot for the legend


def _x(i: int, n: int) -> float:
    return PAD + (WIDTH - 2 * PAD - LEGEND) * (i / (n - 1) if n > 1 else 0.5)


def _y(v: float) -> float:
    return HEIGHT - PAD + (2 * PAD - HEIGHT) * min(max(v, 0.0), 1.0)  # values are in [0, 1]


def line_chart(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Polylines of mean reward and mean Q_com per file, on a 0..1 axis."""
    n = len(stats)
    series = []
    for key, name in (("reward", "reward"), ("q_com", "Q_com")):
        pts = [(_x(i, n), _y(s[key])) for i, s in enumerate(stats) if s[key] is not None]
        series.append({"name": name, "color": SERIES_COLORS[name], "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in pts),
                       "dots": [{"x": round(x, 1), "y": round(y, 1)} for x, y in pts]})
    return {"width": WIDTH, "height": HEIGHT, "series": series, "x_labels": _x_labels(stats, lambda i: _x(i, n)),
            "y_ticks": [{"y": round(_y(v), 1), "label": f"{v:.1f}"} for v in (0.0, 0.5, 1.0)], "pad": PAD,
            "right": WIDTH - PAD - LEGEND}


def _x_labels(stats: list[dict[str, Any]], x_of: Callable[[int], float], most: int = 8) -> list[dict[str, Any]]:
    """At most ``most`` evenly spaced labels (the step, or the file's label for eval files), the last always."""
    n = len(stats)
    every = max(1, -(-n // most))
    return [{"x": round(x_of(i), 1), "label": str(s["step"]) if s["step"] is not None else s["label"]}
            for i, s in enumerate(stats) if i % every == 0 or i == n - 1]


def level_bars(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Stacked bars: the fraction of turns at each compression level, one bar per file."""
    n = len(stats)
    slot = (WIDTH - 2 * PAD - LEGEND) / max(n, 1)
    bars = []
    for i, s in enumerate(stats):
        x, base, rects = PAD + i * slot + slot * 0.1, 0.0, []
        for g, frac in enumerate(s["levels"]):
            if frac > 0:
                rects.append({"x": round(x, 1), "y": round(_y(base + frac), 1), "w": round(slot * 0.8, 1),
                              "h": round(_y(base) - _y(base + frac), 1), "color": LEVEL_COLORS[g],
                              "title": f"{s['label']}: level {g + 1} {frac:.0%}"})
            base += frac
        bars.append(rects)
    labels = _x_labels(stats, lambda i: PAD + (i + 0.5) * slot)
    return {"width": WIDTH, "height": HEIGHT, "bars": bars, "x_labels": labels, "pad": PAD, "right": WIDTH - PAD - LEGEND,
            "legend": [{"label": f"level {g + 1}", "color": c} for g, c in enumerate(LEVEL_COLORS)]}
