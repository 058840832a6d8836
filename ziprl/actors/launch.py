"""Training on Ray, following the paper's Algorithm 1 (``python -m ziprl.launch`` runs :func:`launch`).

Stage 1 (skipped when ``run.sft_checkpoint`` is set): synthesise scripted-teacher demonstrations and fine-tune
the policy on them on the learner ranks; cached by configuration (:func:`ziprl.learner.sft.stage1_dir`).
Stage 2: GRPO + HRR with rollout actors, a Ray Serve retriever and the DeepSpeed learner ranks, driven by the
one training loop (:func:`ziprl.loop.training.train_loop`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray
from ray import serve

from ziprl.actors.driver import RayLearner, RaySource, check_resources, start_rollout_actors
from ziprl.actors.learner_actor import LearnerGroup
from ziprl.actors.ray_utils import cpu_threads, init_ray, signal_handlers_kept, stop_ray
from ziprl.actors.serve_retriever import deploy_retriever
from ziprl.actors.weight_sender import RaySender
from ziprl.config import ZipRLConfig, resolve_engine_dtype
from ziprl.env.demos import build_demos
from ziprl.learner.checkpoint import in_checkpoint_dtype, resumed_learner
from ziprl.learner.sft import stage1_dir, stage1_resumable
from ziprl.loop.stream import QuestionStream
from ziprl.loop.training import train_loop
from ziprl.outputs import locked
from ziprl.retrieval.datasets import load_questions, retriever_config_for
from ziprl.rundir import write_config
from ziprl.tb import MetricsLogger


def run_stage1(cfg: ZipRLConfig) -> tuple[Path, bool | None, LearnerGroup | None]:
    """Demo synthesis + SFT (on the learner ranks, which build their trainer while the demos are made), cached;
    returns the SFT model directory, whether the SFT learner computed in bf16 (None when the cache answered) and
    the ranks when Stage 2 goes on with them (:func:`keeps_ranks`; None when the cache answered)."""
    root = stage1_dir(cfg)
    with locked(root, wait=True):  # a second launch of the same settings waits for this build, then reuses it
        cached = cached_stage1(cfg)
        if cached is not None:
            print(f"[launch] Stage 1: reusing the cached SFT model {cached}", flush=True)
            return cached, None, None
        cfg1 = dataclasses.replace(cfg, demos=dataclasses.replace(cfg.demos, out=str(root / "demos.parquet")))
        resume = stage1_resumable(root)
        if resume:  # the SFT a stopped launch left goes on in the dtype it was written in
            cfg1 = in_checkpoint_dtype(cfg1, root)
        # the ranks start and build their trainer while this process makes the demos; every path out of this block waits
        # for them (a thread left running could act on a Ray the launch has stopped, or start a new one)
        with ThreadPoolExecutor(1) as pool:
            starting = pool.submit(sft_group, cfg1)
            try:
                t0 = time.perf_counter()
                if resume:
                    path = root / "demos.parquet"
                    print(f"[launch] Stage 1: continuing the SFT an earlier launch stopped ({root / 'checkpoints'})",
                          flush=True)
                else:
                    path, counts = build_demos(cfg1)
                    print(f"[launch] Stage 1: {counts['kept']}/{counts['episodes']} demo episodes kept "
                          f"({counts['transitions']} transitions) in {time.perf_counter() - t0:.0f}s; SFT...",
                          flush=True)
            except BaseException:
                with contextlib.suppress(Exception):
                    starting.result()[0].shutdown()
                raise
            group, bf16 = starting.result()
        try:
            model = Path(group.call("sft", str(path), str(root), resume))
        except BaseException:
            group.shutdown()
            raise
        if keeps_ranks(cfg):
            return model, bf16, group
        group.shutdown()
        return model, bf16, None


def keeps_ranks(cfg: ZipRLConfig) -> bool:
    """Whether Stage 2 trains on Stage 1's ranks (their processes, imports and process group already up): on CPUs.
    A GPU learner starts new ranks, whose GPU memory holds nothing of Stage 1's."""
    return not cfg.ray.learner_gpus


def cached_stage1(cfg: ZipRLConfig) -> Path | None:
    """The Stage 1 model directory this configuration cached, None when there is none."""
    model = stage1_dir(cfg) / "model"
    return model if (model / "config.json").is_file() else None


def sft_group(cfg: ZipRLConfig) -> tuple[LearnerGroup, bool]:
    """The Stage 1 learner ranks (:func:`stage1_cpus`) with their trainer built, and whether it computes in bf16."""
    cpus, threads = stage1_cpus(cfg)
    group = LearnerGroup(cfg, cfg.ray.learner_ranks, cpus, cfg.ray.learner_gpus, threads=threads)
    try:
        return group, ray.get(group.start("build_sft_trainer"))[0]
    except BaseException:
        group.shutdown()
        raise


def stage1_cpus(cfg: ZipRLConfig) -> tuple[float, int]:
    """(CPUs a Stage 1 learner rank asks Ray for, torch threads it runs). It asks for ``ray.learner_cpus``, as a
    Stage 2 rank (Stage 2 may go on with it), which leaves the retriever, deploying meanwhile, its CPUs. On a local
    cluster nothing else computes during SFT: each rank runs on its share of every core."""
    share = local_core_share(cfg)
    return cfg.ray.learner_cpus, cpu_threads(cfg.ray.learner_cpus if share is None else share)


def local_core_share(cfg: ZipRLConfig) -> float | None:
    """A learner rank's share of every core of a local cluster, for when nothing else computes (Stage 1, a Stage-2
    step no rollout runs beside); None on a joined cluster, whose nodes others may share."""
    return ray.cluster_resources().get("CPU", 1.0) / cfg.ray.learner_ranks if cfg.ray.address is None else None


def launch(cfg: ZipRLConfig, progress: bool = True) -> dict[str, float]:
    """Start or join Ray, run Stage 1 if needed, then Stage 2; returns the last step's metrics. The signal handlers
    Ray installs in this process are gone when it returns."""
    with signal_handlers_kept():
        return run_on_ray(cfg, progress)


def run_on_ray(cfg: ZipRLConfig, progress: bool) -> dict[str, float]:
    """:func:`launch`'s work: Ray up, Stage 1 and Stage 2, Ray down (a joined cluster: disconnected). ``config.json``
    is written only once Ray is up: a launch that found no cluster, or was stopped while Ray started, leaves its run
    directory unused (a plain rerun starts it)."""
    examples = load_questions(cfg.data)
    out = Path(cfg.run.out_dir)
    init_ray(cfg.ray)
    logger = source = push = None
    try:
        write_config(out, cfg.to_dict())
        logger = MetricsLogger(out)
        check_resources(cfg)
        # the retriever deploys beside Stage 1 (which leaves it its CPUs); leaving the block waits for it, as above
        with ThreadPoolExecutor(1) as pool:
            deploying = pool.submit(deploy_retriever, retriever_config_for(cfg), cfg.ray)
            model, bf16, group = (Path(cfg.run.sft_checkpoint), None, None) if cfg.run.sft_checkpoint else run_stage1(cfg)
            print(f"[launch] Stage 2: GRPO + HRR from {model} with {cfg.ray.num_rollout_actors} rollout actors",
                  flush=True)
            cfg = resumed_learner(cfg)  # a resumed run computes in the dtype it was written in
            if cfg.learner.bf16 is None and bf16 is not None:  # else as Stage 1's learner decided on this hardware
                cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, bf16=bf16))
            if group is None:
                group = LearnerGroup(cfg, cfg.ray.learner_ranks, cfg.ray.learner_cpus, cfg.ray.learner_gpus)
            # the ranks load the model (Stage 1's ranks: in Stage 2's configuration), the retriever may deploy
            building = group.start("build_trainer", str(model), cfg.to_dict(), cpu_threads(cfg.ray.learner_cpus))
            retriever = deploying.result()
        # the engines generate in the learner's dtype when model.dtype=auto: known here once learner.bf16 is set (the
        # actors then load beside the learner), else as the ranks decide it (every rank alike: same hardware)
        if cfg.learner.bf16 is not None:
            cfg = dataclasses.replace(cfg, model=resolve_engine_dtype(cfg.model, cfg.learner.bf16))
        else:
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=ray.get(building)[0]))
        actors = start_rollout_actors(cfg, model, retriever)
        ray.get(building)
        print(f"[launch] the rollout engines generate in {cfg.model.dtype}", flush=True)
        push = RaySender(cfg, group, actors)
        source = RaySource(cfg, actors, push)
        share = local_core_share(cfg)
        idle_threads = cpu_threads(share) if share and not cfg.ray.learner_gpus else None
        learner = RayLearner(group, idle_threads)
        return train_loop(cfg, learner, source, push, QuestionStream(examples, cfg.data.seed), logger, progress)
    finally:
        if logger is not None:
            logger.close()
        if push is not None:
            push.close()
        if source is not None:
            source.close()
        if cfg.ray.address is not None:  # a joined cluster keeps running: take the retriever app off it
            serve.shutdown()
        stop_ray(local=cfg.ray.address is None)  # a local cluster stops whole, Serve with it
