"""Training on Ray, following the paper's Algorithm 1 (``python -m ziprl.launch`` runs :func:`launch`).

Stage 1 (skipped when ``run.sft_checkpoint`` is set): synthesise scripted-teacher demonstrations and fine-tune
the policy on them on the learner ranks; cached by configuration (:func:`ziprl.learner.sft.stage1_dir`).
Stage 2: GRPO + HRR with rollout actors, a Ray Serve retriever and the DeepSpeed learner ranks, driven by the
one training loop (:func:`ziprl.loop.training.train_loop`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import ray
from ray import serve

from ziprl.actors.driver import RayLearner, RaySource, check_gpus, start_rollout_actors
from ziprl.actors.learner_actor import LearnerGroup
from ziprl.actors.ray_utils import init_ray
from ziprl.actors.serve_retriever import deploy_retriever
from ziprl.actors.weight_sync import make_weight_sync
from ziprl.config import ZipRLConfig
from ziprl.env.demos import build_demos
from ziprl.learner.checkpoint import resumed_learner
from ziprl.learner.sft import stage1_dir
from ziprl.loop.stream import QuestionStream
from ziprl.loop.training import train_loop
from ziprl.retrieval.datasets import load_dataset, retriever_config_for
from ziprl.rundir import write_config
from ziprl.tb import MetricsLogger


def run_stage1(cfg: ZipRLConfig) -> Path:
    """Demo synthesis + SFT (on the learner ranks), cached; returns the SFT model directory."""
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
    cpus = max(cfg.ray.learner_cpus, local_core_share(cfg) or 0.0)  # nothing else runs during Stage 1
    group = LearnerGroup(cfg1, cfg.ray.learner_ranks, cpus, cfg.ray.learner_gpus)
    try:
        return Path(group.call("sft", str(path), str(root)))
    finally:
        group.shutdown()


def local_core_share(cfg: ZipRLConfig) -> float | None:
    """A learner rank's share of every core of a local cluster, for when nothing else computes (Stage 1, a Stage-2
    step no rollout runs beside); None on a joined cluster, whose nodes others may share."""
    return ray.cluster_resources().get("CPU", 1.0) / cfg.ray.learner_ranks if cfg.ray.address is None else None


def launch(cfg: ZipRLConfig, progress: bool = True) -> dict[str, float]:
    """Start or join Ray, run Stage 1 if needed, then Stage 2; returns the last step's metrics."""
    examples = load_dataset(cfg.data.dataset, cfg.data.shared_dir, limit=cfg.data.limit, seed=cfg.data.seed)
    out = Path(cfg.run.out_dir)
    write_config(out, cfg.to_dict())
    init_ray(cfg.ray)
    logger = MetricsLogger(out)
    source = push = None
    try:
        check_gpus(cfg)
        model = Path(cfg.run.sft_checkpoint) if cfg.run.sft_checkpoint else run_stage1(cfg)
        print(f"[launch] Stage 2: GRPO + HRR from {model} with {cfg.ray.num_rollout_actors} rollout actors", flush=True)
        cfg = resumed_learner(cfg)  # a resumed run computes in the dtype it was written in
        group = LearnerGroup(cfg, cfg.ray.learner_ranks, cfg.ray.learner_cpus, cfg.ray.learner_gpus)
        building = group.start("build_trainer", str(model))  # the ranks load the model while the retriever deploys
        retriever = deploy_retriever(retriever_config_for(cfg), cfg.ray)
        # the engines generate in the learner's dtype when model.dtype=auto (every rank decides alike: same hardware)
        dtype = ray.get(building)[0]
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))
        print(f"[launch] the rollout engines generate in {dtype}", flush=True)
        actors = start_rollout_actors(cfg, model, retriever)
        push = make_weight_sync(cfg, group, actors)
        source = RaySource(cfg, actors, push)
        share = local_core_share(cfg)
        idle_threads = max(1, int(share)) if share and not cfg.ray.learner_gpus else None
        learner = RayLearner(group, idle_threads)
        metrics = train_loop(cfg, learner, source, push, QuestionStream(examples, cfg.data.seed), logger, progress)
        print(f"[launch] done: {cfg.learner.steps} steps; TensorBoard: tensorboard --logdir {out / 'tb'}", flush=True)
        return metrics
    finally:
        logger.close()
        if push is not None:
            push.close()
        if source is not None:
            source.close()
        serve.shutdown()
        ray.shutdown()
