"""Train ZipRL on Ray, following the paper's Algorithm 1.

    python -m ziprl.launch [--num-rollout-actors N] [--config FILE.yaml] [--address auto] [--steps N]
                           [--out runs/launch] [--resume | --overwrite] [--sft-checkpoint DIR] [--set section.field=value ...]

Stage 1 (skipped when an SFT checkpoint is given): synthesise scripted-teacher demonstrations and
fine-tune the policy on them; cached by configuration, so a second run reuses it.
Stage 2: GRPO + HRR with rollout actors, a Ray Serve retriever and a DeepSpeed learner actor.
With no arguments it runs on the embedded defaults (SmolLM2-135M, the shipped sample) in minutes.
Ctrl-C checkpoints and shuts down cleanly; ``--resume`` continues from the newest checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

from ziprl.config import ConfigError, ZipRLConfig, load_config
from ziprl.errors import run_command
from ziprl.policy.models import check_model_paths
from ziprl.rundir import prepare_run_dir, write_config


def stage1_dir(cfg: ZipRLConfig) -> Path:
    """Cache directory of Stage 1 for this configuration (demos, SFT, env and model settings)."""
    from ziprl.policy.models import cache_root

    key = json.dumps({"demos": dataclasses.asdict(cfg.demos) | {"out": None}, "sft": dataclasses.asdict(cfg.sft),
                      "env": dataclasses.asdict(cfg.env), "model": cfg.model.path, "seed": cfg.learner.seed,
                      "retriever": dataclasses.asdict(cfg.retriever)}, sort_keys=True)
    return cache_root(cfg.model) / "stage1" / hashlib.sha256(key.encode()).hexdigest()[:12]


def run_stage1(cfg: ZipRLConfig) -> Path:
    """Demo synthesis + SFT (on the learner ranks), cached; returns the SFT model directory."""
    import ray

    from ziprl.actors.learner_actor import LearnerGroup
    from ziprl.demos import build_demos

    root = stage1_dir(cfg)
    model = root / "model"
    if (model / "config.json").is_file():
        print(f"[launch] Stage 1: reusing the cached SFT model {model}", flush=True)
        return model
    cfg1 = dataclasses.replace(cfg, demos=dataclasses.replace(cfg.demos, out=str(root / "demos.parquet")))
    t0 = time.perf_counter()
    path, counts = build_demos(cfg1)
    print(f"[launch] Stage 1: {counts['kept']}/{counts['episodes']} demo episodes kept "
          f"({counts['transitions']} transitions) in {time.perf_counter() - t0:.0f}s; SFT...", flush=True)
    cpus = cfg.ray.learner_cpus
    if cfg.ray.address is None:  # a local cluster runs nothing else during Stage 1: give SFT every core
        cpus = max(cpus, ray.cluster_resources().get("CPU", 1.0) / cfg.ray.learner_ranks)
    group = LearnerGroup(cfg1, cfg.ray.learner_ranks, cpus, cfg.ray.learner_gpus)
    try:
        return Path(group.call("sft", str(path), str(root)))
    finally:
        group.shutdown()


def launch(cfg: ZipRLConfig, progress: bool = True) -> dict[str, float]:
    """Start or join Ray, run Stage 1 if needed, then Stage 2; returns the last step's metrics."""
    import ray
    from ray import serve

    from ziprl.actors.driver import RayLearner, RaySource, check_gpus
    from ziprl.actors.learner_actor import LearnerGroup
    from ziprl.actors.ray_utils import init_ray
    from ziprl.actors.serve_retriever import deploy_retriever
    from ziprl.env.datasets import load_dataset
    from ziprl.eval import retriever_config_for
    from ziprl.learner.loop import train_loop
    from ziprl.stream import QuestionStream
    from ziprl.tb import MetricsLogger

    examples = load_dataset(cfg.data.dataset, cfg.data.shared_dir, limit=cfg.data.limit, seed=cfg.data.seed)
    out = Path(cfg.run.out_dir)
    write_config(out, cfg.to_dict())
    init_ray(cfg.ray)
    logger = MetricsLogger(out)
    source = None
    try:
        check_gpus(cfg)
        model = Path(cfg.run.sft_checkpoint) if cfg.run.sft_checkpoint else run_stage1(cfg)
        print(f"[launch] Stage 2: GRPO + HRR from {model} with {cfg.ray.num_rollout_actors} rollout actors", flush=True)
        group = LearnerGroup(cfg, cfg.ray.learner_ranks, cfg.ray.learner_cpus, cfg.ray.learner_gpus)
        group.call("build_trainer", str(model))
        source = RaySource(cfg, model, deploy_retriever(retriever_config_for(cfg), cfg.ray), group)
        metrics = train_loop(cfg, RayLearner(group), source, QuestionStream(examples, cfg.data.seed), logger, progress)
        print(f"[launch] done: {cfg.learner.steps} steps; TensorBoard: tensorboard --logdir {out / 'tb'}", flush=True)
        return metrics
    finally:
        logger.close()
        if source is not None:
            source.close()
        serve.shutdown()
        ray.shutdown()


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-rollout-actors", type=int)
    ap.add_argument("--config")
    ap.add_argument("--address", help="'auto' joins a running cluster; default starts a local one")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true", help="delete the run already in --out and start afresh")
    ap.add_argument("--sft-checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    flags = {"ray.num_rollout_actors": args.num_rollout_actors, "ray.address": args.address,
             "learner.steps": args.steps, "run.out_dir": args.out, "run.sft_checkpoint": args.sft_checkpoint,
             "run.resume": True if args.resume else None}
    try:
        cfg = load_config(args.config, [f"{k}={v}" for k, v in flags.items() if v is not None] + args.set)
        if cfg.run.sft_checkpoint and not (Path(cfg.run.sft_checkpoint) / "config.json").is_file():
            raise ConfigError(f"run.sft_checkpoint {cfg.run.sft_checkpoint} is not a model directory (no config.json)")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check_model_paths(cfg.model.path, cfg.run.sft_checkpoint)
    prepare_run_dir(cfg.run.out_dir, cfg.run.resume, args.overwrite)
    try:
        launch(cfg)
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:  # found once Ray is up: GPUs or learner ranks the cluster cannot place
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
