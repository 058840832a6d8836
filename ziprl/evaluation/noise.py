"""The paper's noisy-retrieval experiment: ``python -m ziprl.eval --noise 0,0.25,0.5,0.75,1.0``.

For each noise level p (``env.retrieval_noise``) and each strategy, the same questions are rolled out with the
same seeds; only the retrieved passages differ. Writes ``noise.json``, ``noise.md``, ``noise.png`` and one
trajectory file per cell (``noise_<p>/trajectories_<strategy>.parquet``) under ``--out``; the table and plot
are rewritten after every cell, so an interrupted sweep leaves what it measured, and one resumed with the same
settings rolls out only the cells it lacks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ziprl.config import ConfigError, ZipRLConfig
from ziprl.env.trajectory import Trajectory, save_trajectories
from ziprl.evaluation.harness import load_eval_setup, run_strategy, saved_results
from ziprl.outputs import own_dir
from ziprl.paths import atomic_write_json, atomic_write_text

CURVE = [("em", "EM"), ("f1", "F1"), ("q_com", "Q_com"), ("tokens_per_trajectory", "tok/trajectory"),
         ("turns", "turns"), ("searches", "searches/q"), ("injected_frac", "injected hits")]


def parse_noise_levels(text: str) -> list[float]:
    """``"0,0.25,1"`` -> [0.0, 0.25, 1.0]; ConfigError for anything that is not a probability."""
    try:
        levels = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--noise takes comma-separated probabilities such as 0,0.25,0.5, got {text!r}") from None
    bad = [p for p in levels if not 0.0 <= p <= 1.0]
    if not levels or bad:
        raise ConfigError(f"--noise levels must be probabilities in [0, 1], got {text!r}")
    return sorted(set(levels))


def injected_fraction(trajs: list[Trajectory]) -> float:
    """Share of searched passages that the noise replaced (the measured p)."""
    turns = [t for tr in trajs for t in tr.turns if t.action == "search"]
    retrieved = sum(t.retrieved for t in turns)
    return sum(t.noisy_hits for t in turns) / retrieved if retrieved else 0.0


def mean_level(stats: dict[str, float]) -> float:
    """Mean chosen level from the level distribution (0 when no level was chosen)."""
    return sum(g * stats[f"level_{g}_frac"] for g in range(1, 6))


def markdown_table(dataset: str, rows: dict[str, dict[str, dict[str, float]]]) -> str:
    head = "| strategy | noise | " + " | ".join(c[1] for c in CURVE) + " | levels 1-5 |"
    lines = [f"Dataset: `{dataset}`", "", head, "|---" * (len(CURVE) + 3) + "|"]
    for strategy, by_p in rows.items():
        for p, s in by_p.items():
            levels = "/".join(f"{s[f'level_{g}_frac']:.2f}" for g in range(1, 6))
            lines.append(f"| {strategy} | {p} | " + " | ".join(f"{s[k]:.3g}" for k, _ in CURVE) + f" | {levels} |")
    return "\n".join(lines) + "\n"


def plot_noise(rows: dict[str, dict[str, dict[str, float]]], path: Path, title: str) -> Path:
    """One panel per metric against noise, a line per strategy."""
    from ziprl.plots import _plt, save_figure

    plt = _plt()
    panels = [("em", "EM"), ("f1", "F1"), ("q_com", "Q_com"), ("tokens_per_trajectory", "tokens / trajectory"),
              ("searches", "searches / question"), ("mean_level", "mean chosen level")]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        for strategy, by_p in rows.items():
            xs = [float(p) for p in by_p]
            ax.plot(xs, [s[key] for s in by_p.values()], marker="o", label=strategy)
        ax.set_xlabel("retrieval noise p")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def noise_sweep(cfg: ZipRLConfig, strategies: list[str], levels: list[float], out: Path,
                progress: bool = True, resume: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """Every strategy at every noise level on the same questions and seeds; writes table, plot, trajectories. With
    ``resume``, the cells a stopped sweep of the same settings in ``out`` measured are kept, not rolled out again,
    and the table holds them all, those not asked for this time included."""
    saved = saved_results(Path(out) / "noise.json", cfg) if resume else {}
    setup = load_eval_setup(cfg)
    out = own_dir(out, "eval", ["noise.json", "noise.md", "noise.png", *(f"noise_{p:g}" for p in levels)])
    rows: dict[str, dict[str, dict[str, float]]] = {s: {} for s in [*strategies, *saved]}
    for strategy, cells in saved.items():  # what this sweep does not measure again stays in its table
        for p, stats in cells.items():
            if (strategy not in strategies or float(p) not in levels) and (
                    out / f"noise_{p}" / f"trajectories_{strategy}.parquet").is_file():
                rows[strategy][p] = stats
    for strategy in strategies:  # a whole curve per strategy first: an interrupted sweep leaves full curves
        for p in levels:
            path = out / f"noise_{p:g}" / f"trajectories_{strategy}.parquet"
            kept = saved.get(strategy, {}).get(f"{p:g}")
            if kept is not None and path.is_file():  # its trajectories are written before the table names it
                rows[strategy][f"{p:g}"] = kept
                print(f"[eval] noise={p:g} {strategy}: kept from the stopped sweep", flush=True)
                continue
            cfg_p = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, retrieval_noise=p))
            stats, trajs = run_strategy(cfg_p, strategy, setup, progress)
            stats["injected_frac"], stats["mean_level"] = injected_fraction(trajs), mean_level(stats)
            rows[strategy][f"{p:g}"] = stats
            save_trajectories(trajs, path)
            print(f"[eval] noise={p:g} {strategy}: EM={stats['em']:.3f} F1={stats['f1']:.3f} Q_com={stats['q_com']:.3f} "
                  f"injected={stats['injected_frac']:.2f} ({stats['seconds']:.0f}s)", flush=True)
            table = by_level(rows)
            report = {"dataset": cfg.data.dataset, "questions": len(setup[0]),
                      "noise_levels": sorted({float(p) for cells in table.values() for p in cells}),
                      "config": cfg.to_dict(), "results": table}
            atomic_write_json(out / "noise.json", report)
            atomic_write_text(out / "noise.md", markdown_table(cfg.data.dataset, table))
            plot_noise(table, out / "noise.png", f"Noisy retrieval ({cfg.data.dataset}, {len(setup[0])} questions)")
    return by_level(rows)


def by_level(rows: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """The strategies that have cells, each one's cells in increasing noise."""
    return {s: dict(sorted(cells.items(), key=lambda kv: float(kv[0]))) for s, cells in rows.items() if cells}
