"""Plots a person would rather look at than a table (matplotlib, Agg backend)."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from ziprl.env.trajectory import Trajectory
from ziprl.paths import atomic_path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


SOFTWARE = "ZipRL"  # a plot's PNG "Software" text: "ZipRL <the script that wrote it>"


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` as a PNG to ``path`` atomically (an old plot stays whole until the new one is complete), tagged
    with the script that wrote it (:data:`SOFTWARE`), then close it; returns ``path``."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": f"{SOFTWARE} {Path(sys.argv[0]).name}"})
    _plt().close(fig)
    return Path(path)


def tokens_per_turn(trajs: list[Trajectory]) -> tuple[list[int], list[float]]:
    """Mean prompt tokens at each turn index (1-based) over the trajectories that reached it."""
    by_turn: dict[int, list[int]] = defaultdict(list)
    for tr in trajs:
        for j, t in enumerate(tr.turns, start=1):
            by_turn[j].append(t.prompt_tokens)
    xs = sorted(by_turn)
    return xs, [sum(by_turn[j]) / len(by_turn[j]) for j in xs]


def plot_tokens_per_turn(series: dict[str, tuple[list[int], list[float]]], path: Path, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=name)
    ax.set_xlabel("turn")
    ax.set_ylabel("prompt tokens")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_levels(dist: dict[str, list[float]], path: Path, title: str) -> Path:
    """Grouped bars: fraction of turns choosing each level 1..5, one group per strategy."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / max(len(dist), 1)
    for k, (name, fracs) in enumerate(dist.items()):
        ax.bar([g + k * width for g in range(1, 6)], fracs, width=width, label=name)
    ax.set_xticks([g + width * (len(dist) - 1) / 2 for g in range(1, 6)], [f"L{g}" for g in range(1, 6)])
    ax.set_ylabel("fraction of turns")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)


def plot_curves(curves: dict[str, list[tuple[int, float]]], path: Path, title: str, ylabel: str,
                bands: dict[str, list[tuple[int, float, float]]] | None = None) -> Path:
    """One line per curve of (step, value); ``bands``: (step, low, high) shaded around the curve of that name."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in curves.items():
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name)
        if bands and name in bands:
            ax.fill_between([b[0] for b in bands[name]], [b[1] for b in bands[name]], [b[2] for b in bands[name]],
                            color=line.get_color(), alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)
