"""Does ZipRL learn? Stage 1, then GRPO + HRR, evaluated on held-out questions (issue 21, part 2).

    python benchmarks/learning.py [--config configs/learn-cpu.yaml] [--seeds 0,1,2] [--steps N]
                                  [--eval-every K] [--eval-limit 30] [--out runs/learning] [--workers 2]
                                  [--name learning]

Questions, all over the pooled corpus (HotpotQA + MuSiQue passages, 6,850):
- training: HotpotQA train (100) + MuSiQue train (100) + HotpotQA dev-distractor questions 0-199;
- held-out: HotpotQA dev-distractor questions 200-299, seen neither by the demonstrations nor by RL.

Stage 1: the scripted teacher plays every training question it can (those with supporting titles), the kept
episodes are the SFT data (cached like ``python -m ziprl.launch``'s). RL: for each seed, ``ziprl.train`` with
w = 0 (plain GRPO) and w = 0.2 (HRR) from the same Stage-1 model on the same question order and sampling
seeds (paired). The Stage-1 model and every ``--eval-every``-th checkpoint are evaluated on the held-out
questions (adaptive strategy, one sample each, seeded). Reports after - before and w = 0.2 - w = 0 with 95%
bootstrap intervals over questions (and over seeds for the paired comparison), per-step training curves, PNGs,
JSON + markdown under benchmarks/results/. Finished runs and evaluations under ``--out`` are read, not redone.

Work runs in ``--workers`` processes of one torch thread each (a seed's two runs side by side, then the
evaluations): on 2 cores two one-thread processes get more done than one two-thread process, since batch-8
decoding does not scale to a second thread (measured: 50 vs 85 tokens/s for 1 vs 2 threads). Each process's output
goes to ``<out>/logs/``.
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

from ziprl.config import load_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HELD_OUT = range(200, 300)  # HotpotQA dev-distractor questions kept for evaluation
WEIGHTS = (0.0, 0.2)


def log(msg: str) -> None:
    print(f"[learning {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stage1(config: Path, overrides: list[str]) -> Path:
    """The Stage-1 model for these settings (cached under ``stage1_dir``), built if missing."""
    from ziprl.env.demos import build_demos
    from ziprl.learner.sft import run_sft, stage1_dir

    cfg = load_config(config, overrides)
    root = stage1_dir(cfg)
    if (root / "model" / "config.json").is_file():
        return root / "model"
    cfg.demos.out = str(root / "demos.parquet")
    demos, counts = build_demos(cfg)
    (root / "demos_counts.json").write_text(json.dumps(counts))
    log(f"Stage 1: {counts['kept']} kept demo episodes of {counts['episodes']}, {counts['transitions']} transitions; SFT")
    t0 = time.perf_counter()
    model = run_sft(cfg, demos, root)
    (root / "sft_seconds.json").write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    return model


def split_questions(out: Path, eval_limit: int) -> tuple[Path, Path, Path]:
    """Training and held-out question files under ``out`` (unified JSONL), and the pooled corpus they search."""
    from ziprl.retrieval.datasets import corpus_for, load_dataset, write_qa_jsonl

    pooled = load_dataset("pooled")
    dev = [ex for ex in pooled if ex.source == "hotpotqa-dev-distractor"]
    held_out = [dev[i] for i in HELD_OUT][:eval_limit]
    held_ids, held_text = {ex.id for ex in held_out}, {ex.question for ex in held_out}
    train = [ex for ex in pooled if ex.id not in held_ids and ex.question not in held_text]
    out.mkdir(parents=True, exist_ok=True)
    return (write_qa_jsonl(train, out / "train.jsonl"), write_qa_jsonl(held_out, out / "heldout.jsonl"),
            corpus_for("pooled"))


def check_demos_disjoint(model: Path, held_out: Path) -> int:
    """Number of demonstration episodes; raises if any was played on a held-out question."""
    import pyarrow.parquet as pq

    from ziprl.retrieval.datasets import load_qa_jsonl

    demos = model.parent / "demos.parquet"
    if not demos.is_file():  # a Stage-1 model given by --stage1-model: its demonstrations are not known
        return 0
    ids = set(pq.read_table(demos, columns=["question_id"]).column(0).to_pylist())
    leaked = ids & {ex.id for ex in load_qa_jsonl(held_out)}
    if leaked:
        raise SystemExit(f"demonstrations played held-out questions: {sorted(leaked)[:5]}")
    return len(ids)


def rl_command(config: Path, overrides: list[str], run_dir: Path) -> list[str] | None:
    """The ``ziprl.train`` command of one RL run, or None when it finished earlier under the same directory."""
    cfg = load_config(config, overrides)
    if len(read_metrics(run_dir)) == cfg.learner.steps:
        return None
    resume = ["--overwrite"] if (run_dir / ".ziprl-run").is_file() else []  # an interrupted run starts over
    return [sys.executable, "-m", "ziprl.train", "--config", str(config), "--out", str(run_dir), *resume,
            *[a for o in overrides for a in ("--set", o)]]


def run_parallel(jobs: list[tuple[str, list[str]]], workers: int, logs: Path) -> None:
    """Run the commands, ``workers`` at a time, each with one torch thread; raise if any fails."""
    import subprocess

    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    logs.mkdir(parents=True, exist_ok=True)
    pending, running, failed = list(jobs), [], []
    while pending or running:
        while pending and len(running) < workers:
            name, cmd = pending.pop(0)
            log(f"start {name} (log: {logs / name}.log)")
            with open(logs / f"{name}.log", "w") as out:
                running.append((name, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)))
        time.sleep(2)
        for name, proc in [r for r in running if r[1].poll() is not None]:
            running.remove((name, proc))
            log(f"{name} finished (exit {proc.returncode})")
            if proc.returncode:
                failed.append(name)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}; see {logs}")


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def checkpoint_model(run_dir: Path, step: int, base: Path) -> Path:
    """The HF model directory of the run's checkpoint at ``step`` (exported once, beside the run)."""
    from ziprl.learner.checkpoint import export_model

    out = run_dir.parent / "models" / f"{run_dir.name}_step{step}"
    if (out / "config.json").is_file():
        return out
    found = sorted((run_dir / "checkpoints").glob(f"step_{step}-*"))
    if not found:
        raise SystemExit(f"{run_dir} has no checkpoint of step {step}")
    return export_model(found[-1], base, out)


def evaluate(config: Path, model: Path, held_out: Path, corpus: Path, cache: Path) -> dict:
    """Held-out evaluation of one model (adaptive strategy, one seeded sample per question), written to ``cache``."""
    from ziprl.env.stats import trajectory_stats
    from ziprl.evaluation.harness import load_eval_setup, run_strategy

    cfg = load_config(config, [f"model.path={model}", f"data.dataset={held_out}", f"retriever.corpus={corpus}",
                               "rollout.group_size=1", "data.seed=0", "model.num_threads=1"])
    log(f"evaluating {model} on {held_out.name}")
    stats, trajs = run_strategy(cfg, "adaptive", load_eval_setup(cfg), progress=True)
    result = {"model": str(model), "stats": stats,
              "per_question": [{"id": t.question_id} | trajectory_stats([t]) for t in trajs]}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(result))
    log(f"  F1 {stats['f1']:.3f} EM {stats['em']:.3f} format errors/turn {stats['format_error_rate']:.3f} "
        f"({stats['seconds']:.0f} s)")
    return result


def eval_command(config: Path, model: Path, held_out: Path, corpus: Path, cache: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--config", str(config), "--eval-one", str(model),
            str(held_out), str(corpus), str(cache)]


# ------------------------------------------------------------------ statistics


def bootstrap(diffs: list[list[float]], n: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-question differences (rows: seeds, columns: questions) and its 95% percentile interval,
    resampling questions (the same draw for every seed) with replacement."""
    import numpy as np

    a = np.asarray(diffs, dtype=float).reshape(len(diffs), -1)
    idx = np.random.default_rng(seed).integers(0, a.shape[1], size=(n, a.shape[1]))
    means = a[:, idx].mean(axis=(0, 2))
    return float(a.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


EVAL_METRICS = ("f1", "em", "format_error_rate", "turns", "searches", "tokens_per_trajectory", "q_com")
TRAIN_METRICS = {"reward": "rollout/reward", "em (pass rate)": "rollout/em", "q_com": "rollout/q_com",
                 "format_error_rate": "rollout/format_error_rate", "zero_variance_frac": "learner/zero_variance_frac",
                 "dlogp_pos_adv": "learner/dlogp_pos_adv", "dlogp_neg_adv": "learner/dlogp_neg_adv",
                 "step_seconds": "perf/step_seconds"}


def per_question(result: dict, metric: str) -> dict[str, float]:
    return {q["id"]: q.get(metric, 0.0) for q in result["per_question"]}


def paired(a: dict, b: dict, metric: str) -> list[float]:
    """b - a per question, over the questions both evaluated."""
    pa, pb = per_question(a, metric), per_question(b, metric)
    return [pb[k] - pa[k] for k in sorted(pa) if k in pb]


def eval_rows(evals: dict[str, dict]) -> list[dict]:
    rows = []
    for name, res in evals.items():
        s = res["stats"]
        rows.append({"model": name, **{m: s.get(m, 0.0) for m in EVAL_METRICS},
                     "levels 1-5": "/".join(f"{s.get(f'level_{g}_frac', 0.0):.2f}" for g in range(1, 6))})
    return rows


def diff_rows(evals: dict[str, dict], seeds: list[int], steps: int) -> list[dict]:
    """After - before (each w, seeds pooled) and w = 0.2 - w = 0 (paired by seed and question), with 95% CIs."""
    rows = []
    for metric in EVAL_METRICS:
        for w in WEIGHTS:
            d = [paired(evals["stage1"], evals[f"w{w:g}_seed{s}_step{steps}"], metric) for s in seeds]
            mean, lo, hi = bootstrap(d)
            rows.append({"comparison": f"w={w:g} step {steps} - Stage 1", "metric": metric, "mean": mean,
                         "ci95_low": lo, "ci95_high": hi, "seeds": len(seeds), "questions": len(d[0])})
        d = [paired(evals[f"w0_seed{s}_step{steps}"], evals[f"w0.2_seed{s}_step{steps}"], metric) for s in seeds]
        mean, lo, hi = bootstrap(d)
        rows.append({"comparison": f"w=0.2 - w=0 at step {steps}", "metric": metric, "mean": mean,
                     "ci95_low": lo, "ci95_high": hi, "seeds": len(seeds), "questions": len(d[0])})
    return rows


def train_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Per run: first-half vs second-half means of the training curves."""
    import statistics

    rows = []
    for name, metrics in runs.items():
        half = max(1, len(metrics) // 2)
        for phase, part in (("first half", metrics[:half]), ("second half", metrics[half:])):
            if part:
                rows.append({"run": name, "steps": phase} | {k: statistics.fmean(m.get(key, 0.0) for m in part)
                                                            for k, key in TRAIN_METRICS.items()})
    return rows


def report(evals: dict[str, dict], runs: dict[str, list[dict]], meta: dict, name: str = "learning") -> None:
    """Tables and plots under benchmarks/results/, every file named ``<name>_*``."""
    import statistics

    from ziprl.plots import plot_curves

    seeds, steps = meta["seeds"], meta["steps"]
    write_results(f"{name}_heldout", eval_rows(evals), meta)
    write_results(f"{name}_diff", diff_rows(evals, seeds, steps), meta)
    write_results(f"{name}_train", train_rows(runs), meta | {"curves": {n: [{k: m.get(key) for k, key in
                                                                         TRAIN_METRICS.items()} for m in r]
                                                                         for n, r in runs.items()}})
    for metric, png in (("reward", f"{name}_reward.png"), ("q_com", f"{name}_qcom.png"),
                        ("zero_variance_frac", f"{name}_zero_variance.png")):
        curves = {f"w={w:g}": [(i + 1, statistics.fmean(runs[f"w{w:g}_seed{s}"][i].get(TRAIN_METRICS[metric], 0.0)
                                                         for s in seeds)) for i in range(steps)] for w in WEIGHTS}
        plot_curves(curves, RESULTS / png, f"Training {metric}, mean over {len(seeds)} seed(s)", metric)
    held = {f"w={w:g}": [(k, statistics.fmean(evals["stage1" if k == 0 else f"w{w:g}_seed{s}_step{k}"]["stats"]["f1"]
                                              for s in seeds)) for k in meta["eval_steps"]] for w in WEIGHTS}
    plot_curves(held, RESULTS / f"{name}_heldout_f1.png", f"Held-out F1 ({meta['questions_held_out']} questions)",
                "F1")


def log_eval_tb(run_dir: Path, step: int, stats: dict) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tb"), filename_suffix=".heldout")
    for m in EVAL_METRICS:
        writer.add_scalar(f"heldout/{m}", stats.get(m, 0.0), step)
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "configs" / "learn-cpu.yaml"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, help="RL steps per run (default: the config's learner.steps)")
    ap.add_argument("--eval-every", type=int, help="evaluate every K-th step's checkpoint (default: the last only)")
    ap.add_argument("--eval-limit", type=int, default=30, help=f"the first N of the {len(HELD_OUT)} held-out questions")
    ap.add_argument("--stage1-model", help="skip Stage 1 and start RL from this model directory")
    ap.add_argument("--out", default=str(REPO / "runs" / "learning"))
    ap.add_argument("--workers", type=int, default=2, help="processes at a time (one torch thread each)")
    ap.add_argument("--stage1-only", action="store_true", help="build (or find) the Stage-1 model and stop")
    ap.add_argument("--name", default="learning", help="results file prefix under benchmarks/results/ (a partial "
                    "run, e.g. one seed, under another name leaves the full run's results as they are)")
    ap.add_argument("--eval-one", nargs=4, metavar=("MODEL", "HELD_OUT", "CORPUS", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    config, out, seeds = Path(args.config), Path(args.out), [int(s) for s in args.seeds.split(",")]
    if args.eval_one:
        evaluate(config, *map(Path, args.eval_one))
        return
    t0 = time.perf_counter()
    model = Path(args.stage1_model) if args.stage1_model else stage1(config, [])
    log(f"Stage-1 model: {model}")
    if args.stage1_only:
        return
    train_path, held_path, corpus = split_questions(out, args.eval_limit)
    demo_questions = check_demos_disjoint(model, held_path)
    steps = args.steps or load_config(config, []).learner.steps
    every = args.eval_every or steps
    eval_steps = [0, *range(every, steps + 1, every)]
    if eval_steps[-1] != steps:
        eval_steps.append(steps)
    names = [f"w{w:g}_seed{seed}" for seed in seeds for w in WEIGHTS]  # seed-major: each seed's pair side by side
    jobs = []
    for name in names:
        w, seed = float(name[1:name.index("_")]), int(name.rsplit("seed", 1)[1])
        overrides = [f"data.dataset={train_path}", f"retriever.corpus={corpus}", f"learner.hrr_weight={w}",
                     f"learner.seed={seed}", f"data.seed={seed}", f"learner.steps={steps}",
                     f"run.sft_checkpoint={model}", f"run.checkpoint_every={every}",
                     "run.keep_checkpoints=0", "model.num_threads=1"]
        if (cmd := rl_command(config, overrides, out / name)) is not None:
            jobs.append((name, cmd))
    run_parallel(jobs, args.workers, out / "logs")
    runs = {name: read_metrics(out / name) for name in names}
    for name in names:
        log(f"{name}: {steps} steps, reward {[round(m['rollout/reward'], 2) for m in runs[name]]}")
    targets = {"stage1": model} | {f"{n}_step{k}": checkpoint_model(out / n, k, model) for n in names
                                   for k in eval_steps[1:]}
    cache = {key: out / "eval" / f"{key}.json" for key in targets}
    run_parallel([(f"eval_{key}", eval_command(config, m, held_path, corpus, cache[key]))
                  for key, m in targets.items() if not cache[key].is_file()], args.workers, out / "logs")
    evals = {key: json.loads(path.read_text()) for key, path in cache.items()}
    for name in names:
        log_eval_tb(out / name, 0, evals["stage1"]["stats"])
        for k in eval_steps[1:]:
            log_eval_tb(out / name, k, evals[f"{name}_step{k}"]["stats"])
    meta = {"config": str(config.relative_to(REPO) if config.is_relative_to(REPO) else config), "seeds": seeds,
            "steps": steps, "eval_steps": eval_steps, "stage1_model": f"<ZIPRL_CACHE>/stage1/{model.parent.name}/model",
            "demo_questions": demo_questions, "questions_held_out": args.eval_limit, "workers": args.workers,
            "settings": load_config(config, []).to_dict(), "seconds": time.perf_counter() - t0}
    counts = model.parent / "demos_counts.json"
    if counts.is_file():
        meta["demos"] = json.loads(counts.read_text())
    for extra in ("sft_seconds.json",):
        if (model.parent / extra).is_file():
            meta["stage1_sft_seconds"] = json.loads((model.parent / extra).read_text())["seconds"]
    report(evals, runs, meta, args.name)
    log(f"done in {meta['seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
