"""Evaluate a policy in SearchCompressEnv the way the paper reports it (``python -m ziprl.eval``).

:func:`evaluate` rolls out every strategy on the same questions and writes ``report.json``, ``report.md``,
``tokens_per_turn.png``, ``levels.png`` and one trajectory Parquet file per strategy. The report is rewritten after
every strategy, so a stopped evaluation keeps what it measured, and one resumed with the same settings
(:func:`saved_results`) rolls out only the strategies it lacks.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError, one_line
from ziprl.config import ZipRLConfig, check_top_k, differences
from ziprl.env.stats import trajectory_stats
from ziprl.env.trajectory import Trajectory, load_trajectories, save_trajectories
from ziprl.outputs import entries, own_dir
from ziprl.paths import atomic_write_json, atomic_write_text
from ziprl.plots import plot_levels, plot_tokens_per_turn, tokens_per_turn

COLUMNS = [("em", "EM"), ("f1", "F1"), ("turns", "turns"), ("searches", "searches/q"), ("opens", "opens/q"),
           ("finish_rate", "finish rate"), ("format_error_rate", "format errors/turn"),
           ("prompt_tokens_per_turn", "prompt tok/turn"), ("tokens_per_trajectory", "tok/trajectory"), ("q_com", "Q_com")]
REPORT_FILES = ("report.json", "report.md", "tokens_per_turn.png", "levels.png")
# what an eval directory holds: the report, the noise sweep's (ziprl.evaluation.noise), their trajectories
is_eval_entry = entries(r"report\.(?:json|md)|tokens_per_turn\.png|levels\.png|trajectories_\w+\.parquet",
                        r"noise\.(?:json|md|png)|noise_[0-9.e+-]+(?:/trajectories_\w+\.parquet)?")


def markdown_report(dataset: str, rows: dict[str, dict[str, float]]) -> str:
    lines = [f"Dataset: `{dataset}`", "", "| strategy | " + " | ".join(c[1] for c in COLUMNS) + " | levels 1-5 |",
             "|---" * (len(COLUMNS) + 2) + "|"]
    for strategy, s in rows.items():
        levels = "/".join(f"{s[f'level_{g}_frac']:.2f}" for g in range(1, 6))
        lines.append(f"| {strategy} | " + " | ".join(f"{s[k]:.3g}" for k, _ in COLUMNS) + f" | {levels} |")
    return "\n".join(lines) + "\n"


def load_eval_setup(cfg: ZipRLConfig) -> tuple[list, Any, Any]:
    """The questions, retriever and generation engine an evaluation runs with."""
    from ziprl.policy import make_engine
    from ziprl.retrieval.datasets import load_questions, retriever_config_for
    from ziprl.retrieval.retriever import Retriever

    examples = load_questions(cfg.data)
    retriever = Retriever.from_config(retriever_config_for(cfg))
    check_top_k(cfg.env, len(retriever))
    return examples, retriever, make_engine(cfg.model)


def run_strategy(cfg: ZipRLConfig, strategy: str, setup: tuple[list, Any, Any], progress: bool = True,
                 ) -> tuple[dict[str, float], list[Trajectory]]:
    """Roll out one strategy (with ``cfg.env``'s other settings) on every question; its stats and trajectories."""
    from ziprl.env import SearchCompressEnv
    from ziprl.policy.rollout import rollout

    examples, retriever, engine = setup
    env_cfg = dataclasses.replace(cfg.env, strategy=strategy)
    t0 = time.perf_counter()
    trajs = rollout(engine, lambda ec=env_cfg: SearchCompressEnv(ec, retriever=retriever, examples=examples),
                    examples, cfg.sampling, group_size=cfg.rollout.group_size, seed=cfg.data.seed, progress=progress)
    stats = trajectory_stats(trajs)
    stats["seconds"] = time.perf_counter() - t0
    return stats, trajs


class EvalResumeError(UserError, ValueError):
    """A stopped evaluation cannot be continued as asked; the message names what differs and the fix."""


def saved_results(path: Path, cfg: ZipRLConfig) -> dict[str, Any]:
    """The results a stopped evaluation wrote to ``path`` (``report.json``, ``noise.json``), empty when it wrote
    none; EvalResumeError when it ran with settings other than ``cfg``'s."""
    import json

    if not os.path.lexists(path):
        return {}
    try:
        if not path.is_file() or path.is_symlink():
            raise TypeError("not a plain file")
        saved = json.loads(path.read_text(encoding="utf-8"))
        then, results = saved["config"], saved["results"]
        if not isinstance(then, dict) or not isinstance(results, dict) or \
                not all(isinstance(r, dict) for r in results.values()):
            raise TypeError("its config and results are not what an evaluation writes")
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise EvalResumeError(f"--resume: {path} is not a report ZipRL wrote ({exc}); pass --overwrite to start "
                              "over") from None
    differ = differences(then, json.loads(json.dumps(cfg.to_dict())))  # as written: tuples as lists
    if differ:
        raise EvalResumeError(f"--resume: {path.parent} was evaluated with other settings ({', '.join(differ[:3])}"
                              f"{', ...' if len(differ) > 3 else ''}); pass the settings it ran with, or --overwrite "
                              "to start over")
    return results


def kept_trajectories(out: Path, saved: dict[str, dict[str, float]]) -> dict[str, list[Trajectory]]:
    """The trajectories of the strategies a stopped evaluation in ``out`` measured (``saved``) and wrote; an
    EvalResumeError names one that cannot be read."""
    import pyarrow as pa

    kept = {}
    for strategy in saved:
        path = out / f"trajectories_{strategy}.parquet"
        if not path.is_file():
            continue
        try:
            kept[strategy] = load_trajectories(path)
        except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            raise EvalResumeError(f"--resume: {path} cannot be read ({one_line(exc)}); delete it to evaluate "
                                  f"{strategy} again, or pass --overwrite to start over") from None
    return kept


def evaluate(cfg: ZipRLConfig, strategies: list[str], out: Path, progress: bool = True,
             resume: bool = False) -> dict[str, dict[str, float]]:
    """Roll out every strategy on the same questions; write report, plots and trajectories. With ``resume``, the
    strategies a stopped evaluation of the same settings in ``out`` measured are kept, not rolled out again, and the
    report holds them all, those not asked for this time included."""
    saved = saved_results(Path(out) / "report.json", cfg) if resume else {}
    kept = kept_trajectories(Path(out), saved)  # read before any model loads: a damaged one fails in a second
    setup = load_eval_setup(cfg)
    examples = setup[0]
    out = own_dir(out, "eval", [*REPORT_FILES, *(f"trajectories_{s}.parquet" for s in strategies)])
    rows: dict[str, dict[str, float]] = {}
    all_trajs: dict[str, list[Trajectory]] = {}
    for strategy in [s for s in kept if s not in strategies]:
        rows[strategy], all_trajs[strategy] = saved[strategy], kept[strategy]
        print(f"[eval] {strategy}: kept in the report (evaluated earlier, not asked for now)", flush=True)
    for strategy in strategies:
        path = out / f"trajectories_{strategy}.parquet"
        if strategy in kept:  # its trajectories are written before the report names it
            rows[strategy], all_trajs[strategy] = saved[strategy], kept[strategy]
            print(f"[eval] {strategy}: kept from the stopped evaluation", flush=True)
            continue
        stats, trajs = run_strategy(cfg, strategy, setup, progress)
        rows[strategy], all_trajs[strategy] = stats, trajs
        save_trajectories(trajs, path)
        print(f"[eval] {strategy}: EM={stats['em']:.3f} F1={stats['f1']:.3f} turns={stats['turns']:.2f} "
              f"format_errors/turn={stats['format_error_rate']:.2f} ({stats['seconds']:.0f}s)", flush=True)
        report = {"dataset": cfg.data.dataset, "questions": len(examples), "config": cfg.to_dict(), "results": rows}
        atomic_write_json(out / "report.json", report)  # after every strategy: a stopped evaluation keeps it
        atomic_write_text(out / "report.md", markdown_report(cfg.data.dataset, rows))
    plot_tokens_per_turn({s: tokens_per_turn(t) for s, t in all_trajs.items()}, out / "tokens_per_turn.png",
                         f"Prompt tokens per turn ({cfg.data.dataset})")
    plot_levels({s: [rows[s][f"level_{g}_frac"] for g in range(1, 6)] for s in rows}, out / "levels.png",
                "Chosen compression levels")
    return rows
