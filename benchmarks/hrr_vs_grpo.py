"""HRR (w = 0.2) vs plain GRPO (w = 0) from the cold-started default model: reward curves over seeds.

    python benchmarks/hrr_vs_grpo.py [--steps 2] [--group-size 2] [--max-turns 3] [--seeds 0,1,2] [--dataset pooled] [--sft-checkpoint DIR]

Each (seed, w) run is ``ziprl.train`` (single process) for ``--steps`` steps on the same question order.
Reports the mean reward, Q_com and format-error rate per phase (first / second half of the steps) with their
cross-seed standard deviations (the paper's stability table), plots the mean reward and Q_com curves, and
records how long it all took.
"""

from __future__ import annotations

import argparse
import json
import os
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
    """The cached Stage 1 model of ``python -m ziprl.launch`` for these settings, built in-process if missing."""
    from ziprl.demos import build_demos
    from ziprl.launch import stage1_dir
    from ziprl.learner.sft import run_sft

    cfg = load_config(None, overrides)
    root = stage1_dir(cfg)
    if (root / "model" / "config.json").is_file():
        return root / "model"
    cfg.demos.out = str(root / "demos.parquet")
    demos, counts = build_demos(cfg)
    print(f"[hrr_vs_grpo] Stage 1: {counts['kept']} demo episodes; SFT", flush=True)
    return run_sft(cfg, demos, root)


def run_one(seed: int, w: float, model: Path, base: list[str], out: Path) -> list[dict]:
    from ziprl.train import train

    run_dir = out / f"w{w:g}_seed{seed}"
    cfg = load_config(None, base + [f"learner.hrr_weight={w}", f"learner.seed={seed}", f"data.seed={seed}",
                                    f"run.out_dir={run_dir}", f"run.sft_checkpoint={model}", "run.checkpoint_every=1000"])
    train(cfg, progress=True)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: x[f"rollout/{k}"] for k in METRICS} for x in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--dataset", default="pooled")
    ap.add_argument("--sft-checkpoint")
    ap.add_argument("--out", default=str(REPO / "runs" / "hrr_vs_grpo"))
    args = ap.parse_args()
    base = [f"learner.steps={args.steps}", f"data.dataset={args.dataset}", "learner.lr=1e-5", "model.num_threads=1",
            f"rollout.group_size={args.group_size}", f"env.max_turns={args.max_turns}", "sampling.max_new_tokens=96",
            "learner.beta=0.001"]
    t0 = time.perf_counter()
    model = Path(args.sft_checkpoint) if args.sft_checkpoint else cold_start_model([])
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
    meta = {"steps": args.steps, "seeds": seeds, "dataset": args.dataset, "settings": base,
            "stage1_seconds": t_sft, "total_seconds": total, "curves": curves}
    write_results("hrr_vs_grpo", rows, meta)
    for m, png in (("reward", "hrr_vs_grpo.png"), ("q_com", "hrr_vs_grpo_qcom.png")):
        mean_curves = {f"w={float(w):g}": [(i + 1, statistics.fmean(c[i] for c in per_w)) for i in range(args.steps)]
                       for w, per_w in curves[m].items()}
        plot_curves(mean_curves, RESULTS / png, f"Mean {m} over {len(seeds)} seeds", m)
    print(f"[hrr_vs_grpo] {total / 60:.1f} min in all")


if __name__ == "__main__":
    main()
