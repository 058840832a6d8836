"""HRR (w = 0.2) vs plain GRPO (w = 0) from a cold-started default model: reward curves over seeds.

    python benchmarks/hrr_vs_grpo.py [--steps 6] [--group-size 4] [--max-turns 5] [--seeds 0,1,2]
                                     [--dataset pooled] [--demo-limit 20] [--sft-checkpoint DIR] [--report-only]

Stage 1 (cached like ``python -m ziprl.launch``'s): scripted-teacher demos for ``--demo-limit`` questions of
each of HotpotQA and MuSiQue, SFT on them. Then each (seed, w) run is ``ziprl.train`` (single process) for
``--steps`` steps, with the same env settings the demos were written under. The two runs of a seed see the
same questions in the same order with the same sampling seeds, so step 1 is identical and later steps differ
only by the updates: the report pairs them.

Reports, per phase (first / second half of the steps), the mean reward, Q_com, format-error rate and
zero-variance-group fraction with their cross-seed standard deviations (the paper's stability table), the
paired differences (w = 0.2 minus w = 0, steps 2..N), plots the mean reward and Q_com curves, and records how
long it all took. A finished (seed, w) run under ``--out`` is read, not redone; ``--report-only`` rebuilds the
report from the runs and the timing of the last results file. Every argument, the data set, ``--sft-checkpoint`` and
the runs' settings are checked (exit 2) before ``--out`` is created, marked as this benchmark's or touched.
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

from _common import RESULTS, at_least, in_work_dir, listed, model_dir, portable, write_results  # noqa: E402
from learning import stage1  # noqa: E402  (Stage 1, cached and locked as launch caches it)

from ziprl.boundary import UserError, one_line  # noqa: E402
from ziprl.config import ZipRLConfig, load_config  # noqa: E402
from ziprl.plots import plot_curves  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# per-step values read from each run's metrics.jsonl
METRICS = {"reward": "rollout/reward", "q_com": "rollout/q_com", "format_error_rate": "rollout/format_error_rate",
           "zero_variance_frac": "learner/zero_variance_frac"}
WEIGHTS = (0.0, 0.2)
KIND = "bench-hrr_vs_grpo"  # the marker kind of its --out (not learning.py's "bench": neither adopts the other's)


def read_run(run_dir: Path, steps: int) -> list[dict] | None:
    """The per-step metrics of a finished run, or None if it has not finished."""
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    keys = METRICS | {"step_seconds": "perf/step_seconds"}
    return [{k: x[key] for k, key in keys.items()} for x in lines] if len(lines) == steps else None


def run_config(seed: int, w: float, model: Path | str | None, base: list[str], run_dir: Path) -> ZipRLConfig:
    """The configuration of the (seed, w) run in ``run_dir`` from ``model`` (None: not known yet, Stage 1 builds it)."""
    return load_config(None, base + [f"learner.hrr_weight={w}", f"learner.seed={seed}", f"data.seed={seed}",
                                     f"run.out_dir={run_dir}", "run.checkpoint_every=1000",
                                     *([f"run.sft_checkpoint={model}"] if model else [])])


def run_one(seed: int, w: float, model: Path, base: list[str], out: Path) -> list[dict]:
    """Per-step metrics of one (seed, w) run; a run finished earlier (same --out) is read, not redone."""
    from ziprl.loop.in_process import train
    from ziprl.rundir import prepare_run_dir

    run_dir = out / f"w{w:g}_seed{seed}"
    cfg = run_config(seed, w, model, base, run_dir)
    done = read_run(run_dir, cfg.learner.steps)
    if done is not None:
        return done
    prepare_run_dir(run_dir, resume=False, overwrite=True)  # an interrupted run starts over (a marked run only)
    train(cfg, progress=True)
    return read_run(run_dir, cfg.learner.steps)


def phase_rows(curves: dict[str, dict[str, list[list[float]]]], steps: int) -> list[dict]:
    """Per w and phase: the mean over seeds of each seed's phase mean, and its cross-seed std."""
    half = max(1, steps // 2)
    rows = []
    for w in curves["reward"]:
        for phase, sl in (("early", slice(0, half)), ("late", slice(half, None))):
            row: dict = {"w": w, "phase": phase}
            for m in METRICS:
                per_seed = [statistics.fmean(c[sl]) for c in curves[m][w] if c[sl]]
                row[f"mean_{m}"] = statistics.fmean(per_seed)
                row[f"{m}_cross_seed_std"] = statistics.pstdev(per_seed) if len(per_seed) > 1 else 0.0
            rows.append(row | {"seeds": len(curves["reward"][w])})
    return rows


def paired_row(curves: dict[str, dict[str, list[list[float]]]]) -> dict:
    """w = 0.2 minus w = 0 on the same seed and step, averaged over steps 2..N (step 1 is identical by design)."""
    row: dict = {"w": "0.2 - 0", "phase": "paired, steps 2+"}
    for m in METRICS:
        per_seed = [statistics.fmean(b - a for a, b in zip(c0[1:], c2[1:], strict=True))
                    for c0, c2 in zip(curves[m]["0"], curves[m]["0.2"], strict=True)]
        row[f"mean_{m}"] = statistics.fmean(per_seed)
        row[f"{m}_cross_seed_std"] = statistics.pstdev(per_seed) if len(per_seed) > 1 else 0.0
    return row | {"seeds": len(curves["reward"]["0"])}


def report(curves: dict[str, dict[str, list[list[float]]]], meta: dict) -> None:
    steps, seeds = meta["steps"], meta["seeds"]
    write_results("hrr_vs_grpo", [*phase_rows(curves, steps), paired_row(curves)], meta | {"curves": curves})
    for m, png in (("reward", "hrr_vs_grpo.png"), ("q_com", "hrr_vs_grpo_qcom.png")):
        mean_curves = {f"w={w}": [(i + 1, statistics.fmean(c[i] for c in per_w)) for i in range(steps)]
                       for w, per_w in curves[m].items()}
        plot_curves(mean_curves, RESULTS / png, f"Mean {m} over {len(seeds)} seeds", m)
    print(f"[hrr_vs_grpo] {meta['train_seconds'] / 60:.1f} min of RL steps over {len(seeds) * len(WEIGHTS)} runs")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, and (unless ``--report-only``) the data set, ``--sft-checkpoint`` and every run's settings,
    checked (exit 2) before anything is written: ``stage1_overrides`` and ``base`` (the runs' settings) filled in."""
    from ziprl.cli.common import check_inputs
    from ziprl.env.demos import demo_examples

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=at_least(1), default=6)
    ap.add_argument("--group-size", type=at_least(1), default=4)
    ap.add_argument("--max-turns", type=at_least(1), default=5)
    ap.add_argument("--seeds", type=listed(at_least(0)), default="0,1,2")
    ap.add_argument("--dataset", default="pooled")
    ap.add_argument("--demo-limit", type=at_least(0), default=20,
                    help="demo questions per dataset (HotpotQA, MuSiQue), 0 for all")
    ap.add_argument("--sft-checkpoint", type=model_dir, help="start the runs from this model (default: build Stage 1)")
    ap.add_argument("--out", default=str(REPO / "runs" / "hrr_vs_grpo"))
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from finished runs")
    args = ap.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        ap.error(f"--seeds {','.join(map(str, args.seeds))}: give each seed once")
    if args.report_only:
        if not (RESULTS / "hrr_vs_grpo.json").is_file():
            ap.error(f"--report-only rebuilds the report of the last results, and {RESULTS / 'hrr_vs_grpo.json'} is "
                     "missing: run without --report-only")
        return args
    # Small settings for a 2-core CPU: short observations, F1 reward (denser than EM for a 135M model).
    env = [f"env.max_turns={args.max_turns}", "env.top_k=3", "env.open_max_chars=1200", "env.reward=f1"]
    args.stage1_overrides = env + ["demos.datasets=hotpotqa,musique", f"demos.limit={args.demo_limit}"]
    args.base = env + [f"learner.steps={args.steps}", f"data.dataset={args.dataset}", "learner.lr=1e-5",
                       f"rollout.group_size={args.group_size}", "sampling.max_new_tokens=160", "learner.beta=0.001"]
    try:  # every input the runs read, as ziprl.train checks it, before --out is touched
        if not args.sft_checkpoint:  # Stage 1 plays these datasets
            demo_examples(load_config(None, args.stage1_overrides))
        runs = [run_config(s, w, args.sft_checkpoint, args.base, Path(args.out) / f"w{w:g}_seed{s}")
                for s in args.seeds for w in WEIGHTS]
        check_inputs(runs[0])  # they differ only in seeds and w
    except (UserError, OSError) as exc:
        ap.error(one_line(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        meta = json.loads((RESULTS / "hrr_vs_grpo.json").read_text())["meta"]
        meta.pop("curves", None)
        out = Path(args.out)
        runs = {w: [read_run(out / f"w{w:g}_seed{s}", meta["steps"]) for s in meta["seeds"]] for w in WEIGHTS}
        if any(r is None for per_w in runs.values() for r in per_w):
            print(f"error: --report-only: not every run under {out} has finished; run without --report-only",
                  file=sys.stderr)
            return 2
        finish(runs, meta)
        return 0
    # runs go into a directory this benchmark marked (a rerun continues there), locked while they run
    return in_work_dir(args.out, lambda out: run(args, out), kind=KIND)


def run(args: argparse.Namespace, out: Path) -> None:
    """Stage 1 (unless ``--sft-checkpoint``), every (seed, w) run in ``out``, then the report."""
    seeds = args.seeds
    t0 = time.perf_counter()
    model = Path(args.sft_checkpoint) if args.sft_checkpoint else stage1(None, args.stage1_overrides)
    t_sft = time.perf_counter() - t0
    # seed-major: the two runs of a seed finish together
    by_seed = [{w: run_one(s, w, model, args.base, out) for w in WEIGHTS} for s in seeds]
    runs = {w: [r[w] for r in by_seed] for w in WEIGHTS}
    meta = {"steps": args.steps, "seeds": seeds, "dataset": args.dataset, "settings": args.base,
            "stage1": args.stage1_overrides, "model": portable(model), "stage1_seconds": t_sft}
    finish(runs, meta)


def finish(runs: dict[float, list[list[dict]]], meta: dict) -> None:
    """The curves of ``runs`` and their report."""
    curves = {m: {f"{w:g}": [[s[m] for s in r] for r in per_w] for w, per_w in runs.items()} for m in METRICS}
    meta["train_seconds"] = sum(s["step_seconds"] for per_w in runs.values() for r in per_w for s in r)
    report(curves, meta)


if __name__ == "__main__":
    raise SystemExit(main())
