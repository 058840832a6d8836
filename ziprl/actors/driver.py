"""The distributed training loop: rollout actors fill a bounded queue, the learner consumes it.

Rollout actors run continuously (one batch in flight each) while the learner trains, so generation and
updates overlap; each group carries the policy version it was generated with, and groups more than
``ray.max_staleness`` versions behind are dropped and counted. A rollout actor that dies is restarted by
Ray; its in-flight batch is discarded whole (never half-counted) and its questions are re-dispatched.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from tqdm import tqdm

from ziprl.actors.learner_actor import LearnerGroup
from ziprl.actors.rollout_actor import RolloutActor, example_dicts
from ziprl.actors.serve_retriever import deploy_retriever
from ziprl.actors.weights import WeightRef, is_fresh
from ziprl.config import ConfigError, ZipRLConfig
from ziprl.env.stats import trajectory_stats
from ziprl.env.trajectory import Trajectory, from_table, save_trajectories, to_table
from ziprl.env.types import QAExample
from ziprl.stream import QuestionStream

ROLLOUT_NAME = "ziprl-rollout-{}"


def rollout_cpus(cfg: ZipRLConfig) -> float:
    """CPUs per rollout actor: the configured amount, shrunk on a local cluster so N actors always fit."""
    want = cfg.ray.rollout_actor_cpus
    if cfg.ray.address is not None:
        return want
    total = ray.cluster_resources().get("CPU", 1.0)
    left = total - cfg.ray.learner_ranks * cfg.ray.learner_cpus - cfg.ray.retriever_cpus * cfg.ray.retriever_replicas
    return max(0.01, min(want, left / cfg.ray.num_rollout_actors))


def check_gpus(cfg: ZipRLConfig) -> None:
    """Before any work: the GPUs the learner ranks and rollout actors ask for must be in the cluster.

    A local cluster cannot grow: ConfigError. A joined one may still scale up: a warning.
    """
    r = cfg.ray
    want = r.learner_ranks * r.learner_gpus + r.num_rollout_actors * r.rollout_gpus
    have = ray.cluster_resources().get("GPU", 0.0)
    if want <= have + 1e-9:
        return
    msg = (f"the run asks for {want:g} GPUs ({r.learner_ranks} learner ranks x {r.learner_gpus:g} + "
           f"{r.num_rollout_actors} rollout actors x {r.rollout_gpus:g}) and the cluster has {have:g}; lower "
           "ray.num_rollout_actors, ray.rollout_gpus, ray.learner_ranks or ray.learner_gpus")
    if r.address is None:
        raise ConfigError(msg)
    print(f"[launch] warning: {msg}; until the autoscaler adds GPUs the actors wait", file=sys.stderr, flush=True)


def _groups(trajs: list[Trajectory]) -> list[list[Trajectory]]:
    by: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by[t.group_id].append(t)
    return list(by.values())


class Driver:
    """Owns the actors and the queue; ``run()`` trains ``cfg.learner.steps`` steps."""

    def __init__(self, cfg: ZipRLConfig, model_path: Path, examples: list[QAExample], logger: Any, progress: bool = True):
        from ziprl.eval import retriever_config_for

        self.cfg, self.logger, self.progress = cfg, logger, progress
        self.out = Path(cfg.run.out_dir)
        self.stream = QuestionStream(examples, cfg.data.seed)
        self.learner = LearnerGroup(cfg, cfg.ray.learner_ranks, cfg.ray.learner_cpus, cfg.ray.learner_gpus)
        self.learner.call("build_trainer", str(model_path))
        self.retriever = deploy_retriever(retriever_config_for(cfg), cfg.ray)
        cpus = rollout_cpus(cfg)
        self.actors = [
            RolloutActor.options(name=ROLLOUT_NAME.format(i), num_cpus=cpus, num_gpus=cfg.ray.rollout_gpus)
            .remote(cfg.to_dict(), str(model_path), self.retriever, i, max(1, int(cpus)))
            for i in range(cfg.ray.num_rollout_actors)
        ]
        self.wref: WeightRef | None = None
        self.inflight: dict[ray.ObjectRef, tuple[int, list[QAExample]]] = {}
        self.retry: deque[list[QAExample]] = deque()
        self.queue: deque[list[Trajectory]] = deque()
        self.idle: list[int] = []
        self.dispatched = 0
        self.counters = {"stale_dropped": 0, "rollout_failures": 0, "groups_trained": 0}
        self._gen = {"tokens": 0, "seconds": 0.0}
        self.bar = tqdm(total=cfg.learner.steps, desc="train", unit="step", disable=not progress)
        self.postfix: dict[str, str] = {}

    def resume(self) -> int:
        pos = self.learner.call("load_latest", str(self.out))
        if pos is not None:
            self.stream.restore(pos)
        version = self.learner.call("version")
        if version:
            self.wref = self.learner.call("publish")
        return version

    def _dispatch(self, i: int) -> None:
        qs = self.retry.popleft() if self.retry else self.stream.next_batch(self.cfg.rollout.batch_questions)
        seed = self.cfg.learner.seed * 1_000_003 + self.dispatched
        self.dispatched += 1
        self.inflight[self.actors[i].run_batch.remote(example_dicts(qs), seed, self.wref)] = (i, qs)

    def _collect(self) -> None:
        """Wait for one finished batch; queue its groups, or re-dispatch its questions if the actor died."""
        ready, _ = ray.wait(list(self.inflight), num_returns=1)
        i, qs = self.inflight.pop(ready[0])
        try:
            table, stats = ray.get(ready[0])
        except RayActorError:
            self.counters["rollout_failures"] += 1
            self.retry.append(qs)
            self._dispatch(i)  # Ray restarts the actor; the call waits for it
            return
        self._gen["tokens"] += stats["tokens"]
        self._gen["seconds"] += stats["gen_seconds"]
        self.queue.extend(_groups(from_table(table)))
        self._note(rollouts=f"{self._gen['tokens']} tok", queue=str(len(self.queue)))
        if len(self.queue) < self.cfg.ray.queue_size:
            self._dispatch(i)
        else:
            self.idle.append(i)

    def _take_batch(self, version: int) -> list[list[Trajectory]] | None:
        """``global_batch_questions`` fresh groups from the queue (stale ones dropped), or None if too few."""
        fresh = []
        while self.queue and len(fresh) < self.cfg.learner.global_batch_questions:
            g = self.queue.popleft()
            if is_fresh(g[0].policy_version, version, self.cfg.ray.max_staleness):
                fresh.append(g)
            else:
                self.counters["stale_dropped"] += 1
        if len(fresh) < self.cfg.learner.global_batch_questions:
            self.queue.extendleft(reversed(fresh))
            return None
        return fresh

    def run(self) -> dict[str, float]:
        cfg = self.cfg
        version = self.resume() if cfg.run.resume else 0
        for i in range(len(self.actors)):
            self._dispatch(i)
        metrics: dict[str, float] = {}
        self.bar.update(version)
        t_step = time.perf_counter()
        while version < cfg.learner.steps:
            self._collect()
            while version < cfg.learner.steps and (groups := self._take_batch(version)) is not None:
                trajs = [t for g in groups for t in g]
                learn = self.learner.call("train_step", ray.put([to_table(trajs)]))  # one copy for all ranks
                self.wref = self.learner.call("publish")
                t_push = time.perf_counter()
                for a in self.actors:
                    a.update_weights.remote(self.wref)  # applied between their generation batches
                version = self.wref.version
                self.counters["groups_trained"] += len(groups)
                save_trajectories(trajs, self.out / "trajectories" / f"step_{version:06d}.parquet")
                metrics = self._metrics(trajs, learn, version, time.perf_counter() - t_push, t_step)
                self.logger.log(version, metrics)
                if version % cfg.run.checkpoint_every == 0 or version == cfg.learner.steps:
                    self.learner.call("save_checkpoint", str(self.out), self.stream.position)
                t_step = time.perf_counter()
                self.bar.update(1)
                self._note(reward=f"{metrics['rollout/reward']:.2f}", q_com=f"{metrics['rollout/q_com']:.2f}")
                while self.idle and len(self.queue) < cfg.ray.queue_size:
                    self._dispatch(self.idle.pop())
        self.bar.close()
        return metrics

    def _note(self, **fields: str) -> None:
        """Update the progress bar's postfix: rollout tokens since the last step, queue depth, last reward."""
        self.postfix.update(fields)
        self.bar.set_postfix(self.postfix)

    def _metrics(self, trajs: list[Trajectory], learn: dict[str, float], version: int, push_dispatch: float,
                 t_step: float) -> dict[str, float]:
        lags = [version - 1 - t.policy_version for t in trajs]
        gen, self._gen = self._gen, {"tokens": 0, "seconds": 0.0}
        return {**{f"rollout/{k}": v for k, v in trajectory_stats(trajs).items()},
                **{f"learner/{k}": v for k, v in learn.items()},
                "perf/gen_tokens_per_second": gen["tokens"] / max(gen["seconds"], 1e-9),
                "perf/weight_push_seconds": self.wref.seconds + push_dispatch,
                "perf/step_seconds": time.perf_counter() - t_step,
                "system/staleness": sum(lags) / len(lags), "system/queue_depth": float(len(self.queue)),
                **{f"system/{k}": float(v) for k, v in self.counters.items()}}

    def checkpoint(self) -> str:
        return self.learner.call("save_checkpoint", str(self.out), self.stream.position)
