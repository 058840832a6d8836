"""The base rate a training task offers GRPO: pass@G of a model on training questions (issue 47 §1).

    python benchmarks/base_rate.py --model DIR [--task invented|real] [--questions 32] [--group 8] [--seed 0]
                                   [--name base_rate_<task>]

Samples G trajectories for each of the first ``--questions`` training questions (the task's config, its sampling
temperature) and reports, per question, how many of the G succeeded (F1 > 0 and EM = 1) and whether the group's
rewards vary: the share of groups with reward variance is the share of GRPO groups that carry any gradient.
Writes ``benchmarks/results/<name>.{json,md}`` (headed by commit, command, config, machine and date) and a
histogram PNG of successes per group.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, at_least, check_plots, model_dir, results_name, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"invented": REPO / "configs" / "learn-invented.yaml", "real": REPO / "configs" / "learn-cpu.yaml"}


def group_rows(trajs: list, sources: dict[str, str]) -> list[dict]:
    """One row per question: its successes out of G, mean and spread of the reward, whether the reward varies."""
    by_q: dict[str, list] = {}
    for t in trajs:
        by_q.setdefault(t.question_id, []).append(t)
    rows = []
    for qid, ts in by_q.items():
        rewards = [t.reward for t in ts]
        rows.append({"question": qid, "source": sources.get(qid, ""), "samples": len(ts),
                     "em_passes": sum(t.em >= 1.0 for t in ts), "f1_positive": sum(t.f1 > 0 for t in ts),
                     "reward_mean": statistics.fmean(rewards), "reward_std": statistics.pstdev(rewards),
                     "varies": len(set(rewards)) > 1})
    return rows


def summary(rows: list[dict]) -> dict:
    """Pooled figures: success rates, the share of groups with reward variance, the pass-count histogram."""
    n = len(rows)
    return {"questions": n, "em_rate": sum(r["em_passes"] for r in rows) / sum(r["samples"] for r in rows),
            "f1_positive_rate": sum(r["f1_positive"] for r in rows) / sum(r["samples"] for r in rows),
            "groups_with_variance": sum(r["varies"] for r in rows) / n,
            "em_pass_histogram": dict(sorted(Counter(r["em_passes"] for r in rows).items()))}


def plot_passes(passes: list[int], group: int, path: Path) -> None:
    """Bar chart: how many questions had k of their G samples right, k = 0..G."""
    from ziprl.plots import _plt, save_figure

    counts = Counter(passes)
    fig, ax = _plt().subplots(figsize=(6, 3.5))
    ax.bar(range(group + 1), [counts.get(k, 0) for k in range(group + 1)], color="#4c72b0")
    ax.set_xlabel(f"exact-match successes in a group of {group}")
    ax.set_ylabel("questions")
    ax.set_title(f"Base rate: {len(passes)} training questions (0 and {group}: no reward variance from EM)")
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=model_dir, required=True, help="the model directory to measure (e.g. the Stage-1 model)")
    ap.add_argument("--task", choices=sorted(CONFIGS), default="invented")
    ap.add_argument("--questions", type=at_least(1), default=32, help="the first N training questions")
    ap.add_argument("--group", type=at_least(1), default=8, help="G, samples per question")
    ap.add_argument("--seed", type=at_least(0), default=0, help="the data's sampling seed")
    ap.add_argument("--name", type=results_name, help="results file name (default base_rate_<task>)")
    args = ap.parse_args()
    name = args.name or f"base_rate_{args.task}"
    try:  # the results and plot it writes are new or its own: checked before any work
        check_plots(name if args.name else results_name(name))  # --name was checked when it was parsed
    except argparse.ArgumentTypeError as exc:
        ap.error(f"--name {name}: {exc}")

    from ziprl.boundary import UserError
    from ziprl.config import load_config

    config = CONFIGS[args.task]
    try:  # the arguments only: a bad value or model exits 2 before anything loads
        cfg = load_config(config, [f"model.path={args.model}", f"data.limit={args.questions}",
                                   f"rollout.group_size={args.group}", f"data.seed={args.seed}",
                                   "rollout.dynamic_sampling=false"])
    except UserError as exc:
        ap.exit(2, f"error: {exc}\n")

    from ziprl.evaluation.harness import load_eval_setup, run_strategy

    t0 = time.perf_counter()
    setup = load_eval_setup(cfg)
    stats, trajs = run_strategy(cfg, cfg.env.strategy, setup, progress=True)
    rows = group_rows(trajs, {ex.id: ex.source for ex in setup[0]})
    pooled = summary(rows)
    meta = {"model": str(args.model), "task": args.task, "group": args.group, "seed": args.seed,
            "seconds": time.perf_counter() - t0, "summary": pooled, "eval_stats": stats}
    write_results(name, [pooled | {"em_pass_histogram": str(pooled["em_pass_histogram"])}] + rows, meta,
                  config=config)
    plot_passes([r["em_passes"] for r in rows], args.group, RESULTS / f"{name}.png")
    print(f"[base_rate] EM {pooled['em_rate']:.3f}, F1>0 {pooled['f1_positive_rate']:.3f}, groups with reward "
          f"variance {pooled['groups_with_variance']:.2f}, passes per group {pooled['em_pass_histogram']}")


if __name__ == "__main__":
    main()
