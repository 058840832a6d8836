"""One GRPO + HRR step of the production path (``ziprl.train``: env rollouts, advantages, DeepSpeed learner, weight
push into the generating engine), split into its parts, for learner variants measured in one run.

    python benchmarks/step_profile.py [--config configs/learn-cpu.yaml] [--model DIR] [--steps 2]
                                      [--variants unshared,float32,bf16] [--name step_profile]

Each variant runs ``--steps`` steps of ``python -m ziprl.train`` in this process at the learning benchmark's settings
(``--config``; the held-out split is not needed here, the shipped sample's questions are used) from ``--model``
(default: the embedded model; pass the Stage-1 model for realistic response lengths). The first step warms up; the
table reports the mean of the others. Variants: ``unshared`` (float32, every turn runs its whole prompt),
``float32`` (the shared system prompt runs once per micro-batch), ``bf16`` (bf16 autocast, shared prefix),
``bf16-engine`` (bf16 learner and a bf16 generating engine; truncated importance sampling corrects the mismatch). The parts
come from the step's own logged metrics: generation (engine seconds), the learner's forward, reference forward,
backward and optimizer step, the weight export + push, the trajectory write; MFU is 6 x parameters x tokens the
forward ran / learner seconds against the GEMM peak of the learner's dtype measured right after the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import at_least, listed, model_dir, one_of, portable, results_name, write_results  # noqa: E402

from ziprl.boundary import UserError  # noqa: E402
from ziprl.config import load_config  # noqa: E402

VARIANTS = {  # name: config overrides
    "unshared": ["learner.bf16=false", "learner.share_prefix=false"],
    "float32": ["learner.bf16=false", "learner.share_prefix=true"],
    "bf16": ["learner.bf16=true", "learner.share_prefix=true"],
    "bf16-engine": ["learner.bf16=true", "learner.share_prefix=true", "model.dtype=bfloat16"],
}
PARTS = {  # table column: metrics.jsonl key
    "step_s": "perf/step_seconds", "rollout_s": "perf/wait_seconds", "gen_tokens_per_s": "perf/gen_tokens_per_second", "forward_s": "learner/forward_seconds",
    "reference_s": "learner/reference_seconds", "backward_s": "learner/backward_seconds",
    "optimizer_s": "learner/optimizer_seconds", "learner_s": "learner/seconds", "push_s": "perf/push_seconds",
    "trajectories_s": "perf/trajectories_seconds", "trained_tokens": "learner/trained_tokens",
    "computed_tokens": "learner/computed_tokens", "mfu": "learner/mfu",
    "gemm_peak_tflops": "learner/gemm_peak_tflops", "mismatch_abs_mean": "learner/mismatch_abs_mean",
    "tis_mean": "learner/tis_mean",
}


def variant_overrides(variant: str, args: argparse.Namespace) -> list[str]:
    """The config overrides of one variant's run (its model and output directory aside)."""
    return [*VARIANTS[variant], f"learner.steps={args.steps}", "data.dataset=sample", "ray.max_staleness=0",
            f"run.checkpoint_every={args.steps + 1}"]


def profile(variant: str, args: argparse.Namespace, out: Path) -> dict:
    """Run the steps of one variant; the mean of every part over the steps after the first."""
    from ziprl.loop.in_process import train

    model = [f"run.sft_checkpoint={args.model}"] if args.model else []
    cfg = load_config(Path(args.config), [*variant_overrides(variant, args), *model, f"run.out_dir={out}"])
    start = time.perf_counter()
    train(cfg, progress=True)
    wall = time.perf_counter() - start
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    row = {"variant": variant, "measured_steps": len(steps)}
    row.update({col: statistics.mean(s.get(key, 0.0) for s in steps) for col, key in PARTS.items()})
    row["run_wall_s"] = wall
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "learn-cpu.yaml"),
                    help="the run's settings")
    ap.add_argument("--model", type=model_dir, help="start from this model directory (e.g. the Stage-1 model)")
    ap.add_argument("--steps", type=at_least(2), default=2, help="steps per variant (at least 2: the first warms up)")
    ap.add_argument("--variants", type=listed(one_of(VARIANTS, "variant ")), default=["unshared", "float32", "bf16"],
                    help=f"comma-separated, in this order, of {', '.join(VARIANTS)}")
    ap.add_argument("--name", type=results_name, default="step_profile")
    args = ap.parse_args()
    variants = args.variants
    try:  # the config with each variant's overrides: checked before any step runs (the model when parsed)
        for name in variants:
            load_config(Path(args.config), variant_overrides(name, args))
    except UserError as exc:
        ap.exit(2, f"error: --config: {exc}\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ziprl-step-profile-") as tmp:
        for variant in variants:
            rows.append(profile(variant, args, Path(tmp) / variant))
    for row in rows:
        row["learner_speedup"] = rows[0]["learner_s"] / row["learner_s"]
    write_results(args.name, rows, meta=vars(args) | {"config": portable(args.config), "model": portable(args.model)})


if __name__ == "__main__":
    main()
