"""One GRPO + HRR step of the production path (``ziprl.train``: env rollouts, advantages, DeepSpeed learner, weight
push into the generating engine), split into its parts, float32 against bf16 learner compute, in one run.

    python benchmarks/step_profile.py [--steps 2] [--questions 2] [--group-size 4] [--max-turns 3]
                                      [--precisions false,true] [--name step_profile]

Each precision runs ``--steps`` steps of ``python -m ziprl.train`` in this process on the shipped sample (the
first step warms up; the table reports the mean of the others). The parts come from the step's own logged
metrics: generation (engine seconds), the learner's forward, reference forward, backward and optimizer step,
the weight export + push, the trajectory write; MFU is 6 x parameters x trained tokens / learner seconds
against the GEMM peak of the learner's dtype measured in the same process.
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

from _common import write_results  # noqa: E402

from ziprl.config import load_config  # noqa: E402

PARTS = {  # table column: metrics.jsonl key
    "step_s": "perf/step_seconds", "rollout_s": "perf/wait_seconds", "gen_tokens_per_s": "perf/gen_tokens_per_second", "forward_s": "learner/forward_seconds",
    "reference_s": "learner/reference_seconds", "backward_s": "learner/backward_seconds",
    "optimizer_s": "learner/optimizer_seconds", "learner_s": "learner/seconds", "push_s": "perf/push_seconds",
    "save_s": "perf/save_seconds", "trained_tokens": "learner/trained_tokens", "mfu": "learner/mfu",
    "gemm_peak_tflops": "learner/gemm_peak_tflops", "mismatch_abs_mean": "learner/mismatch_abs_mean",
    "tis_mean": "learner/tis_mean",
}


def profile(bf16: str, args: argparse.Namespace, out: Path) -> dict:
    """Run the steps with ``learner.bf16=<bf16>``; the mean of every part over the steps after the first."""
    from ziprl.learner.in_process import train

    cfg = load_config(None, [
        f"learner.bf16={bf16}", f"learner.steps={args.steps}", f"learner.global_batch_questions={args.questions}",
        f"rollout.group_size={args.group_size}", f"env.max_turns={args.max_turns}", f"learner.beta={args.beta}",
        f"learner.micro_batch_turns={args.micro_batch}", f"run.out_dir={out}", "ray.max_staleness=0",
        f"run.checkpoint_every={args.steps + 1}",
    ])
    start = time.perf_counter()
    train(cfg, progress=True)
    wall = time.perf_counter() - start
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    row = {"learner": "bf16 autocast" if bf16 == "true" else "float32", "measured_steps": len(steps)}
    row.update({col: statistics.mean(s.get(key, 0.0) for s in steps) for col, key in PARTS.items()})
    row["run_wall_s"] = wall
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--beta", type=float, default=0.001)
    ap.add_argument("--precisions", default="false,true", help="learner.bf16 values to profile, in this order")
    ap.add_argument("--name", default="step_profile")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is warm-up)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ziprl-step-profile-") as tmp:
        for bf16 in args.precisions.split(","):
            rows.append(profile(bf16, args, Path(tmp) / f"bf16-{bf16}"))
    if len(rows) == 2:
        rows[1]["learner_speedup"] = rows[0]["learner_s"] / rows[1]["learner_s"]
    write_results(args.name, rows, meta={k: v for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
