"""Async on one GPU (issue 48, item 4): ``ziprl.train`` steps with each batch generated inside the loop's wait
(``rollout.overlap=off``) against the next batch generated on a thread and a CUDA stream of its own while the learner
trains on this one (``thread``), and against the GPU split between two processes (``split``: ``ziprl.launch`` with one
rollout actor on ``--gpu-share`` of the GPU and one learner rank on the rest, ``ray.rollout_gpus`` /
``ray.learner_gpus``), the run otherwise the same.

    python benchmarks/gpu_async.py [--modes off,thread,split] [--steps 6] [--questions 8] [--group 8] [--turns 6]
                                   [--new-tokens 128] [--gpu-share 0.5] [--arch NAME] [--set KEY=VALUE ...]
                                   [--name gpu_async]
    python benchmarks/gpu_async.py --cpu-smoke   (a tiny random model on the CPU, 2 steps a mode: checks the script)

Each mode trains into a fresh directory, off and thread with :func:`ziprl.loop.in_process.train` (what
``python -m ziprl.train`` runs), split with :func:`ziprl.actors.launch.launch` (``python -m ziprl.launch``, its
retriever on Ray Serve): the sample questions and index, the embedded SmolLM2-135M as the Stage-1 model
(``--set run.sft_checkpoint=DIR`` for another; ``--arch`` for random-initialised weights of one of
benchmarks/gpu_step.py's shapes, e.g. qwen3-1.7b: the learner's MFU in a real run at that size), the learner's settings
chosen for the hardware, ``ray.max_staleness=1``, one checkpoint (the last step's). From its metrics.jsonl, per mode,
the mean over the steps after the first (it warms up kernels and captures the decode graphs) and before the last
(nothing generates beside the last step): step seconds, generation tokens/s, learner seconds and MFU, the seconds the
learner waited for rollouts (in thread mode mostly in the weight push, which waits for the job in flight) and their
share of the step, the mean staleness; ``speedup`` is off's step seconds over the mode's.

It needs what ``ziprl.train`` needs: DeepSpeed, FAISS, the embedded model and the encoder, and for split Ray with
Serve; on a bare GPU machine the payload of scripts/gpu_payload.sh (``--ray`` for split), installed as
scripts/gpu_learn.sh installs it (its ``STORE/site`` on PYTHONPATH). Results: benchmarks/results/<name>.{json,md}.
Without a CUDA GPU (and without ``--cpu-smoke``) it says so and exits 0.
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

from _common import results_name, write_results  # noqa: E402
from gpu_step import ARCHS, build_model  # noqa: E402

MODES = ("off", "thread", "split")
METRICS = {  # row column: metrics.jsonl key
    "step_s": "perf/step_seconds", "gen_tok_s": "perf/gen_tokens_per_second", "learner_s": "learner/seconds",
    "mfu": "learner/mfu", "wait_s": "perf/wait_seconds", "wait_frac": "system/learner_wait_frac",
    "push_s": "perf/weight_push_seconds", "staleness": "system/staleness", "reward": "rollout/reward",
}
SMOKE = ["model.device=cpu", "data.limit=5", "learner.beta=0.001"]  # with the tiny model as run.sft_checkpoint


def overrides(args, mode: str, out: Path) -> list[str]:
    """The config overrides of one mode's run: the shape the flags give, split's processes, then ``--set``."""
    split = mode == "split"
    share = 0.0 if args.cpu_smoke else args.gpu_share  # on a CPU every process computes on the CPU
    rest = 1 - share if share else 0.0
    return [f"learner.global_batch_questions={args.questions}", f"rollout.group_size={args.group}",
            f"env.max_turns={args.turns}", f"sampling.max_new_tokens={args.new_tokens}", f"learner.steps={args.steps}",
            f"run.checkpoint_every={args.steps}", "ray.max_staleness=1", f"rollout.overlap={'off' if split else mode}",
            *(["ray.num_rollout_actors=1", "ray.learner_ranks=1", f"ray.rollout_gpus={share:g}",
               f"ray.learner_gpus={rest:g}"] if split else []),
            f"run.out_dir={out / mode}", *args.set]


def summary(mode: str, steps: list[dict]) -> dict:
    """One mode's row from its metrics.jsonl lines: the mean of each METRICS column over the steps after the first and
    before the last (all of them when there are fewer than three)."""
    kept = steps[1:-1] or steps
    row = {"mode": mode, "steps": len(steps), "steps_averaged": len(kept)}
    row.update({col: statistics.mean(s[key] for s in kept) for col, key in METRICS.items() if all(key in s for s in kept)})
    return row


def run_mode(args, mode: str, out: Path) -> dict:
    """Train ``--steps`` steps in ``mode``; its row (with the run's wall seconds)."""
    from ziprl.config import load_config
    from ziprl.loop.in_process import train

    cfg = load_config(None, overrides(args, mode, out))
    t0 = time.perf_counter()
    if mode == "split":
        from ziprl.actors.launch import launch

        launch(cfg, progress=False)
    else:
        train(cfg, progress=False)
    wall = time.perf_counter() - t0
    lines = (out / mode / "metrics.jsonl").read_text().splitlines()
    return {**summary(mode, [json.loads(line) for line in lines if line.strip()]), "run_s": wall}


def add_speedup(rows: list[dict]) -> None:
    """Each row's ``speedup``: off's step seconds over the row's (once off has run)."""
    off = next((r for r in rows if r["mode"] == "off" and r.get("step_s")), None)
    for row in rows:
        if off is not None and row.get("step_s"):
            row["speedup"] = off["step_s"] / row["step_s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--gpu-share", type=float, default=0.5,
                    help="split: the rollout actor's share of the GPU (ray.rollout_gpus); the learner rank gets the rest")
    ap.add_argument("--arch", help="random-initialised weights of this shape (benchmarks/gpu_step.py's ARCHS) with the "
                                   "embedded model's tokenizer, instead of the embedded model")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides, after the flags")
    ap.add_argument("--name", type=results_name, help="results name (default gpu_async, with --cpu-smoke gpu_async_cpu_smoke)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="a tiny random model on the CPU, 2 questions x 2, 2 turns of 8 tokens, 2 steps a mode")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    if [m for m in modes if m not in MODES] or not modes:
        print(f"gpu_async: --modes {args.modes!r}: choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    if not 0 < args.gpu_share < 1:
        print(f"gpu_async: --gpu-share {args.gpu_share:g}: choose a share of the GPU between 0 and 1", file=sys.stderr)
        return 2
    if args.arch is not None and args.arch not in ARCHS:
        print(f"gpu_async: --arch {args.arch!r}: choose from {', '.join(ARCHS)}", file=sys.stderr)
        return 2
    if args.cpu_smoke:
        args.steps, args.questions, args.group, args.turns, args.new_tokens = 2, 2, 2, 2, 8
        args.set = SMOKE + args.set
    name = args.name or ("gpu_async_cpu_smoke" if args.cpu_smoke else "gpu_async")
    from ziprl.config import ConfigError, load_config

    try:
        for mode in modes:
            load_config(None, overrides(args, mode, Path("runs")))
    except ConfigError as exc:
        print(f"gpu_async: {exc}", file=sys.stderr)
        return 2
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_async: no CUDA GPU visible to PyTorch: nothing to measure (--cpu-smoke checks the script on a CPU)")
        return 0
    meta = {"modes": modes, "overrides": overrides(args, "<mode>", Path("<tmp>")), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if not args.cpu_smoke else "cpu",
            "model": f"{args.arch}, random init" if args.arch else "tiny, random init" if args.cpu_smoke else "embedded"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_async-") as tmp:
        from transformers import AutoTokenizer

        from ziprl.config import ModelConfig
        from ziprl.policy.models import build_tiny_llama, resolve_model_path

        model = embedded = resolve_model_path(ModelConfig())  # a Stage-1 model: ziprl.launch skips Stage 1
        if args.arch is not None:
            model = build_model(args.arch, AutoTokenizer.from_pretrained(embedded), Path(tmp) / args.arch,
                                device="cpu" if args.cpu_smoke else "cuda")
        elif args.cpu_smoke:
            model = build_tiny_llama(embedded, Path(tmp) / "tiny")
        args.set = [f"run.sft_checkpoint={model}", *args.set]
        for mode in modes:
            print(f"gpu_async: {mode}", flush=True)
            rows.append(run_mode(args, mode, Path(tmp)))
            add_speedup(rows)
            write_results(name, rows, meta)  # after each mode: a cut-short run keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
