"""The paper's comparisons with a model that answers: every context strategy, with and without retrieval noise, for
the Stage-1 model and an RL checkpoint of ``benchmarks/learning.py``, on its held-out questions (issue 21, part 3).

    python benchmarks/learning_compare.py [--out runs/learning] [--run w0.2_seed0] [--step N] [--limit 20]
                                          [--noise 0,1] [--strategies adaptive,uniform,react,summary,window]
                                          [--stage1-model DIR]

Reads what ``benchmarks/learning.py`` left under ``--out`` (the held-out split, the Stage-1 model, the run's
checkpoints), runs the noise sweep (``python -m ziprl.eval --noise``, one process per model and strategy, one torch
thread each, ``--workers`` at a time) for both models on the same questions and seeds, and writes
``benchmarks/results/learning_compare{,_claims,_diff}.{json,md}`` (the diff: RL - Stage 1 per strategy and noise
level, F1 and Q_com, with 95% bootstrap intervals over questions) and ``learning_compare.png``. Two of the paper's
claims are checked and reported as measured: adaptive's tokens per trajectory <= 0.5x ReAct's at >= ReAct's F1 (no
noise), and adaptive's F1 falls least as the noise rises. Finished sweeps under ``--out/compare`` are read, not redone.
The defaults (20 questions, noise 0 and 1) fit this 2-core machine: each cell is one 20-question evaluation (15
questions, all 20 cells: 34 min with two workers).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import NAME_RE, RESULTS, in_work_dir, write_results  # noqa: E402
from learning import Job, bootstrap, checkpoint_model, read_metrics, run_parallel  # noqa: E402

from ziprl.boundary import UserError, one_line  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLAIMED = ("adaptive", "react")  # the strategies the paper's claims compare
METRICS = ("f1", "em", "tokens_per_trajectory", "prompt_tokens_per_turn", "response_tokens_per_turn", "turns",
           "searches", "q_com", "format_error_rate")


def sweep_job(config: Path, model: Path, held_out: Path, corpus: Path, strategy: str, levels: list[float],
              limit: int, out: Path, threads: int = 1) -> list[str] | None:
    """The ``ziprl.eval --noise`` command of one model and strategy on ``threads`` torch threads, or None when
    ``out/noise.json`` holds it (the same questions: a sweep over another ``limit`` is redone)."""
    done = out / "noise.json"
    if done.is_file():
        report = json.loads(done.read_text())
        if report.get("questions") == limit and all(f"{p:g}" in report["results"].get(strategy, {}) for p in levels):
            return None
    return [sys.executable, "-m", "ziprl.eval", "--config", str(config), "--model", str(model), "--dataset",
            str(held_out), "--limit", str(limit), "--samples", "1", "--seed", "0", "--strategy", strategy,
            "--noise", ",".join(f"{p:g}" for p in levels), "--out", str(out), "--set", f"retriever.corpus={corpus}",
            "--set", f"model.num_threads={threads}"]


def claims(results: dict, levels: list[float]) -> list[dict]:
    """The paper's two claims per model, as measured."""
    rows = []
    for model, by_strategy in results.items():
        zero, high = f"{min(levels):g}", f"{max(levels):g}"
        ada, react = by_strategy["adaptive"][zero], by_strategy["react"][zero]
        ratio = ada["tokens_per_trajectory"] / react["tokens_per_trajectory"]
        rows.append({"model": model, "claim": "adaptive tokens/trajectory <= 0.5x react at >= react's F1 (noise 0)",
                     "measured": f"{ratio:.2f}x tokens, F1 {ada['f1']:.3f} vs {react['f1']:.3f}",
                     "met": ratio <= 0.5 and ada["f1"] >= react["f1"]})
        drops = {s: r[zero]["f1"] - r[high]["f1"] for s, r in by_strategy.items()}
        least = min(drops, key=drops.get)
        rows.append({"model": model, "claim": f"adaptive's F1 falls least from noise {zero} to {high}",
                     "measured": ", ".join(f"{s} {d:+.3f}" for s, d in drops.items()),
                     "met": drops["adaptive"] <= drops[least] + 1e-12})
    return rows


def cell_scores(sweep: Path, strategy: str, level: float) -> dict[str, dict[str, float]]:
    """F1 and mean Q_com (over its scored turns) of each question's trajectory in one cell of a sweep."""
    import statistics

    import pyarrow.parquet as pq

    out = {}
    for t in pq.read_table(sweep / f"noise_{level:g}" / f"trajectories_{strategy}.parquet").to_pylist():
        scored = [turn["q_com"] for turn in t["turns"] if turn["q_com"] is not None]
        out[t["question_id"]] = {"f1": t["f1"], "q_com": statistics.fmean(scored) if scored else None}
    return out


def diff_rows(before: dict[str, Path], after: dict[str, Path], levels: list[float]) -> list[dict]:
    """RL - Stage 1 per strategy and noise level: mean of per-question differences with a 95% bootstrap interval."""
    rows = []
    for strategy, sweep in before.items():
        for p in levels:
            a, b = cell_scores(sweep, strategy, p), cell_scores(after[strategy], strategy, p)
            for metric in ("f1", "q_com"):
                d = [b[q][metric] - a[q][metric] for q in sorted(a)
                     if q in b and a[q][metric] is not None and b[q][metric] is not None]
                if d:
                    mean, lo, hi = bootstrap([d])
                    rows.append({"strategy": strategy, "noise": p, "metric": metric, "rl_minus_stage1": mean,
                                 "ci95_low": lo, "ci95_high": hi, "questions": len(d)})
    return rows


def plot(results: dict, levels: list[float], path: Path) -> None:
    from ziprl.plots import _plt, save_figure

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for ax, key, label in zip(axes, ("f1", "tokens_per_trajectory", "q_com"), ("F1", "tokens / trajectory", "Q_com"),
                              strict=True):
        for model, style in zip(results, ("--", "-"), strict=False):
            for i, (strategy, by_p) in enumerate(results[model].items()):
                ys = [by_p[f"{p:g}"][key] for p in levels]
                if key == "q_com" and not any(ys):  # a strategy that does not compress has no Q_com
                    continue
                ax.plot(levels, ys, style, color=f"C{i}", marker="o", label=f"{strategy} ({model})")
        ax.set_xlabel("retrieval noise p")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    fig.legend(*axes[1].get_legend_handles_labels(), loc="center right", fontsize=7)
    fig.suptitle("Strategies on held-out questions: Stage 1 (dashed) vs RL (solid)")
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    save_figure(fig, path, dpi=110)


def run_name(name: str) -> str:
    """An argparse ``type``: the name of a run directory directly under ``--out``, never a path (so nothing is read
    or written outside ``--out``)."""
    if not NAME_RE.fullmatch(name) or ".." in name:
        raise argparse.ArgumentTypeError(f"{name[:80]!r}: give the name of a run directory directly under --out "
                                         "(e.g. w0.2_seed0): letters, digits, '_', '-' or '.' (not first), no '..'")
    return name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, every one checked (exit 2) before anything is exported or run: ``levels``, ``strategies``,
    ``held_out``, ``run_dir``, ``step`` and ``stage1`` filled in."""
    from ziprl.config import load_config
    from ziprl.evaluation.noise import parse_noise_levels
    from ziprl.learner.sft import stage1_dir
    from ziprl.policy.models import validate_model_dir
    from ziprl.registry import STRATEGIES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "configs" / "learn-cpu.yaml"), help="the evaluations' settings")
    ap.add_argument("--out", default=str(REPO / "runs" / "learning"), help="the --out directory of learning.py")
    ap.add_argument("--run", type=run_name, default="w0.2_seed0",
                    help="the RL run under --out whose checkpoint is compared (a name, not a path)")
    ap.add_argument("--step", type=int, help="its checkpoint step (default: the run's last)")
    ap.add_argument("--limit", type=int, default=20, help="the first N held-out questions")
    ap.add_argument("--noise", default="0,1", help="comma-separated retrieval noise levels in 0..1")
    ap.add_argument("--strategies", default="adaptive,uniform,react,summary,window",
                    help="comma-separated strategies to compare (adaptive and react among them)")
    ap.add_argument("--workers", type=int, default=2, help="evaluations at a time (one torch thread each)")
    ap.add_argument("--stage1-model", help="the Stage-1 model the run started from, if learning.py was given one")
    args = ap.parse_args(argv)
    if min(args.limit, args.workers, 1 if args.step is None else args.step) < 1:
        ap.error("--limit, --workers and --step must be >= 1")
    args.strategies = list(dict.fromkeys(s.strip() for s in args.strategies.split(",")))
    if not set(CLAIMED) <= set(args.strategies) <= set(STRATEGIES):
        ap.error(f"--strategies {','.join(args.strategies)}: choose from {', '.join(STRATEGIES)}, with "
                 f"{' and '.join(CLAIMED)} among them (the claims compare them)")
    out = Path(args.out)
    args.held_out, args.run_dir = out / "heldout.jsonl", out / args.run
    args.step = args.step or len(read_metrics(args.run_dir))
    if not args.held_out.is_file() or not args.step:
        ap.error(f"run benchmarks/learning.py --out {out} first (no held-out split or no {args.run} run)")
    try:
        args.levels = parse_noise_levels(args.noise)
        cfg = load_config(args.config, [])
        args.stage1 = validate_model_dir(Path(args.stage1_model) if args.stage1_model else stage1_dir(cfg) / "model")
    except (UserError, OSError) as exc:
        ap.error(one_line(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return in_work_dir(args.out, lambda out: compare(args, out))  # sweeps and logs go into learning.py's directory


def compare(args: argparse.Namespace, out: Path) -> None:
    """Export the run's checkpoint, sweep both models, then write the results files."""
    from ziprl.retrieval.datasets import corpus_for

    step, strategies, levels, corpus = args.step, args.strategies, args.levels, corpus_for("pooled")
    models = {"Stage 1": args.stage1, f"RL {args.run} step {step}": checkpoint_model(args.run_dir, step, args.stage1)}
    t0 = time.perf_counter()
    dirs = {(name, s): out / "compare" / ("stage1" if name == "Stage 1" else f"{args.run}_step{step}") / s
            for name in models for s in strategies}
    jobs = [Job(f"compare_{d.parent.name}_{s}", functools.partial(
        sweep_job, Path(args.config), models[name], args.held_out, corpus, s, levels, args.limit, d))
            for (name, s), d in dirs.items()]
    run_parallel(jobs, args.workers, out / "logs")
    results = {name: {s: json.loads((dirs[(name, s)] / "noise.json").read_text())["results"][s] for s in strategies}
               for name in models}
    rows = [{"model": m, "strategy": s, "noise": p} | {k: r[p][k] for k in METRICS}
            for m, by_s in results.items() for s, r in by_s.items() for p in r]
    cells = [r[p]["seconds"] for by_s in results.values() for r in by_s.values() for p in r]
    meta = {"run": args.run, "step": step, "questions": args.limit, "noise": levels, "strategies": strategies,
            "claims": claims(results, levels), "seconds": time.perf_counter() - t0,
            "cell_seconds_total": sum(cells), "workers": args.workers}
    write_results("learning_compare", rows, meta)
    write_results("learning_compare_claims", meta["claims"], {"run": args.run, "step": step})
    before, after = ({s: dirs[(name, s)] for s in strategies} for name in models)
    write_results("learning_compare_diff", diff_rows(before, after, levels), {"run": args.run, "step": step})
    plot(results, levels, RESULTS / "learning_compare.png")


if __name__ == "__main__":
    sys.exit(main())
