"""The paper's comparisons with a model that answers: every context strategy, with and without retrieval noise, for
the Stage-1 model and an RL checkpoint of ``benchmarks/learning.py``, on its held-out questions (issue 21, part 3).

    python benchmarks/learning_compare.py [--out runs/learning] [--run w0.2_seed0] [--step N] [--limit 20]
                                          [--noise 0,1] [--strategies adaptive,uniform,react,summary,window]
                                          [--stage1-model DIR]

Reads what ``benchmarks/learning.py`` left under ``--out`` (the held-out split, the Stage-1 model, the run's
checkpoints), runs the noise sweep (``python -m ziprl.eval --noise``, one process per model and strategy, one torch
thread each, ``--workers`` at a time) for both models on the same questions and seeds, and
writes ``benchmarks/results/learning_compare.{json,md}`` and ``learning_compare.png``. Two of the paper's claims are
checked and reported as measured: adaptive's tokens per trajectory <= 0.5x ReAct's at >= ReAct's F1 (no noise), and
adaptive's F1 falls least as the noise rises. Finished sweeps under ``--out/compare`` are read, not redone.
The defaults (20 questions, noise 0 and 1) fit this 2-core machine: each cell is one 20-question evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
METRICS = ("f1", "em", "tokens_per_trajectory", "turns", "searches", "q_com", "format_error_rate")


def sweep_job(config: Path, model: Path, held_out: Path, corpus: Path, strategy: str, levels: list[float],
              limit: int, out: Path) -> list[str] | None:
    """The ``ziprl.eval --noise`` command of one model and strategy, or None when ``out/noise.json`` holds it (the
    same questions: a sweep over another ``limit`` is redone)."""
    done = out / "noise.json"
    if done.is_file():
        report = json.loads(done.read_text())
        if report.get("questions") == limit and all(f"{p:g}" in report["results"].get(strategy, {}) for p in levels):
            return None
    return [sys.executable, "-m", "ziprl.eval", "--config", str(config), "--model", str(model), "--dataset",
            str(held_out), "--limit", str(limit), "--samples", "1", "--seed", "0", "--strategy", strategy,
            "--noise", ",".join(f"{p:g}" for p in levels), "--out", str(out), "--set", f"retriever.corpus={corpus}",
            "--set", "model.num_threads=1"]


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


def plot(results: dict, levels: list[float], path: Path) -> None:
    from ziprl.plots import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, key, label in zip(axes, ("f1", "tokens_per_trajectory", "q_com"), ("F1", "tokens / trajectory", "Q_com"),
                              strict=True):
        for model, style in zip(results, ("--", "-"), strict=False):
            for strategy, by_p in results[model].items():
                ax.plot(levels, [by_p[f"{p:g}"][key] for p in levels], style, marker="o", label=f"{strategy} ({model})")
        ax.set_xlabel("retrieval noise p")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Strategies on held-out questions: Stage 1 (dashed) vs RL (solid)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "configs" / "learn-cpu.yaml"))
    ap.add_argument("--out", default=str(REPO / "runs" / "learning"))
    ap.add_argument("--run", default="w0.2_seed0", help="the RL run under --out whose checkpoint is compared")
    ap.add_argument("--step", type=int, help="its checkpoint step (default: the run's last)")
    ap.add_argument("--limit", type=int, default=20, help="the first N held-out questions")
    ap.add_argument("--noise", default="0,1")
    ap.add_argument("--strategies", default="adaptive,uniform,react,summary,window")
    ap.add_argument("--workers", type=int, default=2, help="evaluations at a time (one torch thread each)")
    ap.add_argument("--stage1-model", help="the Stage-1 model the run started from, if learning.py was given one")
    args = ap.parse_args()
    from learning import checkpoint_model, read_metrics, run_parallel

    from ziprl.config import load_config
    from ziprl.evaluation.noise import parse_noise_levels
    from ziprl.learner.sft import stage1_dir
    from ziprl.retrieval.datasets import corpus_for

    out, config = Path(args.out), Path(args.config)
    held_out, run_dir = out / "heldout.jsonl", out / args.run
    step = args.step or len(read_metrics(run_dir))
    if not held_out.is_file() or not step:
        raise SystemExit(f"run benchmarks/learning.py --out {out} first (no held-out split or no {args.run} run)")
    stage1 = Path(args.stage1_model) if args.stage1_model else stage1_dir(load_config(config, [])) / "model"
    models = {"Stage 1": stage1, f"RL {args.run} step {step}": checkpoint_model(run_dir, step, stage1)}
    levels, strategies = parse_noise_levels(args.noise), args.strategies.split(",")
    t0 = time.perf_counter()
    dirs = {(name, s): out / "compare" / ("stage1" if name == "Stage 1" else f"{args.run}_step{step}") / s
            for name in models for s in strategies}
    jobs = [(f"compare_{d.parent.name}_{s}", cmd) for (name, s), d in dirs.items()
            if (cmd := sweep_job(config, models[name], held_out, corpus_for("pooled"), s, levels, args.limit, d))]
    run_parallel(jobs, args.workers, out / "logs")
    results = {name: {s: json.loads((dirs[(name, s)] / "noise.json").read_text())["results"][s] for s in strategies}
               for name in models}
    rows = [{"model": m, "strategy": s, "noise": p} | {k: r[p][k] for k in METRICS}
            for m, by_s in results.items() for s, r in by_s.items() for p in r]
    meta = {"run": args.run, "step": step, "questions": args.limit, "noise": levels, "strategies": strategies,
            "claims": claims(results, levels), "seconds": time.perf_counter() - t0}
    write_results("learning_compare", rows, meta)
    write_results("learning_compare_claims", meta["claims"], {"run": args.run, "step": step})
    plot(results, levels, RESULTS / "learning_compare.png")


if __name__ == "__main__":
    main()
