"""HRR (w = 0.2) vs plain GRPO (w = 0) from a cold-started default model: reward curves over seeds.

    python benchmarks/hrr_vs_grpo.py [--steps 6] [--group-size 4] [--max-turns 5] [--seeds 0,1,2]
                                     [--dataset pooled] [--demo-limit 20] [--sft-checkpoint DIR]

Stage 1 (cached like ``python -m ziprl.launch``'s): scripted-teacher demos for ``--demo-limit`` questions of
each of HotpotQA and MuSiQue, SFT on them. Then each (seed, w) run is ``ziprl.train`` (single process) for
``--steps`` steps on the same question order, with the same env settings the demos were written under.
Reports the mean reward, Q_com and format-error rate per phase (first / second half of the steps) with their
cross-seed standard deviations (the paper's stability table), plots the mean reward and Q_com curves, and
records how long it all took.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, write_results  # noqa: E402

from ziprl.config import load_config  # noqa: E402
from ziprl.plots import plot_curves  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
METRICS = ("reward", "q_com", "format_error_rate")  # per-step means from each run's metrics.jsonl


def cold_start_model(overrides: list[str]) -> Path:
    """The Stage 1 model for these settings (cached where ``python -m ziprl.launch`` caches it), built if missing."""
    from ziprl.demos import build_demos
    from ziprl.launch import stage1_dir
    from ziprl.learner.sft import run_sft

    cfg = load_config(None, overrides)
    root = stage1_dir(cfg)
    if (root / "model" / "config.json").is_file():
        return root / "model"
    cfg.demos.out = str(root / "demos.parquet")
    demos, counts = build_demos(cfg)
    print(f"[hrr_vs_grpo] Stage 1: {counts['kept']} demo episodes, {counts['transitions']} transitions; SFT",
          flush=True)
    return run_sft(cfg, demos, root)


def run_one(seed: int, w: float, model: Path, base: list[str], out: Path) -> list[dict]:
    """Per-step rollout metrics of one (seed, w) run; a run finished earlier (same --out) is read, not redone."""
    from ziprl.train import train

    run_dir = out / f"w{w:g}_seed{seed}"
    cfg = load_config(None, base + [f"learner.hrr_weight={w}", f"learner.seed={seed}", f"data.seed={seed}",
                                    f"run.out_dir={run_dir}", f"run.sft_checkpoint={model}", "run.checkpoint_every=1000"])
    metrics = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    if len(lines) != cfg.learner.steps:
        shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted run starts over
        train(cfg, progress=True)
        lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    return [{k: x[f"rollout/{k}"] for k in METRICS} for x in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--dataset", default="pooled")
    ap.add_argument("--demo-limit", type=int, default=20, help="demo questions per dataset (HotpotQA, MuSiQue)")
    ap.add_argument("--sft-checkpoint")
    ap.add_argument("--out", default=str(REPO / "runs" / "hrr_vs_grpo"))
    args = ap.parse_args()
    # Small settings for a 2-core CPU: short observations, F1 reward (denser than EM for a 135M model).
    env = [f"env.max_turns={args.max_turns}", "env.top_k=3", "env.open_max_chars=1200", "env.reward=f1"]
    stage1 = env + ["demos.datasets=hotpotqa,musique", f"demos.limit={args.demo_limit}"]
    base = env + [f"learner.steps={args.steps}", f"data.dataset={args.dataset}", "learner.lr=1e-5",
                  f"rollout.group_size={args.group_size}", "sampling.max_new_tokens=160", "learner.beta=0.001"]
    t0 = time.perf_counter()
    model = Path(args.sft_checkpoint) if args.sft_checkpoint else cold_start_model(stage1)
    t_sft = time.perf_counter() - t0
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: dict[float, list[list[dict]]] = {0.0: [], 0.2: []}
    for seed in seeds:
        for w in runs:
            runs[w].append(run_one(seed, w, model, base, Path(args.out)))
    half = max(1, args.steps // 2)
    rows = []
    for w, per_w in runs.items():
        for phase, sl in (("early", slice(0, half)), ("late", slice(half, None))):
            row: dict = {"w": w, "phase": phase}
            for m in METRICS:
                per_seed = [statistics.fmean(s[m] for s in r[sl]) for r in per_w if r[sl]]
                row[f"mean_{m}"] = statistics.fmean(per_seed) if per_seed else float("nan")
                row[f"{m}_cross_seed_std"] = statistics.pstdev(per_seed) if len(per_seed) > 1 else 0.0
            rows.append(row | {"seeds": len(per_w)})
    total = time.perf_counter() - t0
    curves = {m: {str(w): [[s[m] for s in r] for r in per_w] for w, per_w in runs.items()} for m in METRICS}
    meta = {"steps": args.steps, "seeds": seeds, "dataset": args.dataset, "settings": base, "stage1": stage1,
            "model": str(model), "stage1_seconds": t_sft, "total_seconds": total, "curves": curves}
    write_results("hrr_vs_grpo", rows, meta)
    for m, png in (("reward", "hrr_vs_grpo.png"), ("q_com", "hrr_vs_grpo_qcom.png")):
        mean_curves = {f"w={float(w):g}": [(i + 1, statistics.fmean(c[i] for c in per_w)) for i in range(args.steps)]
                       for w, per_w in curves[m].items()}
        plot_curves(mean_curves, RESULTS / png, f"Mean {m} over {len(seeds)} seeds", m)
    print(f"[hrr_vs_grpo] {total / 60:.1f} min in all")


if __name__ == "__main__":
    main()
