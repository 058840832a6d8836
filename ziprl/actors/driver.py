"""Ray glue for the training loop: rollout actors as a rollout source, the learner ranks as its learner.

:func:`ziprl.loop.training.train_loop` runs unchanged on top: :class:`RaySource` runs each scheduled job as one
``run_batch`` call on a rollout actor (one call in flight per actor); the weight push is the configured
:class:`~ziprl.actors.weight_sender.RaySender`, which every actor applies before its next job; :class:`RayLearner`
forwards steps and checkpoints to the learner ranks. A rollout actor that dies is restarted by Ray; its job comes
back failed and the scheduler re-runs it (nothing half-counted).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError

from ziprl.actors.learner_actor import LearnerGroup
from ziprl.actors.ray_utils import cpu_threads
from ziprl.actors.rollout_actor import RolloutActor, example_dicts
from ziprl.actors.weight_sender import RaySender
from ziprl.config import ConfigError, ZipRLConfig
from ziprl.env.group import Group, from_arrow, to_arrow
from ziprl.loop.source import Completion
from ziprl.retrieval.types import QAExample

ROLLOUT_NAME = "ziprl-rollout-{}"
RESTART_TIMEOUT_S = 600  # a restarted rollout actor reloads its model


def rollout_cpus(cfg: ZipRLConfig) -> float:
    """CPUs per rollout actor: the configured amount, shrunk on a local cluster so N actors always fit."""
    want = cfg.ray.rollout_actor_cpus
    if cfg.ray.address is not None:
        return want
    total = ray.cluster_resources().get("CPU", 1.0)
    left = total - cfg.ray.learner_ranks * cfg.ray.learner_cpus - cfg.ray.retriever_cpus * cfg.ray.retriever_replicas
    return max(0.01, min(want, left / cfg.ray.num_rollout_actors))


def check_resources(cfg: ZipRLConfig) -> None:
    """Before any work: the GPUs the learner ranks and rollout actors ask for must be in the cluster, and on a local
    cluster the learner ranks' and the retriever's CPUs too (the rollout actors take what they leave).

    A local cluster cannot grow: ConfigError. A joined one may still scale up: a warning (GPUs only).
    """
    r, resources = cfg.ray, ray.cluster_resources()
    want = r.learner_ranks * r.learner_gpus + r.num_rollout_actors * r.rollout_gpus
    have = resources.get("GPU", 0.0)
    if want > have + 1e-9:
        msg = (f"the run asks for {want:g} GPUs ({r.learner_ranks} learner ranks x {r.learner_gpus:g} + "
               f"{r.num_rollout_actors} rollout actors x {r.rollout_gpus:g}) and the cluster has {have:g}; lower "
               "ray.num_rollout_actors, ray.rollout_gpus, ray.learner_ranks or ray.learner_gpus")
        if r.address is None:
            raise ConfigError(msg)
        print(f"[launch] warning: {msg}; until the autoscaler adds GPUs the actors wait", file=sys.stderr, flush=True)
    cpus = r.learner_ranks * r.learner_cpus + r.retriever_replicas * r.retriever_cpus
    total = resources.get("CPU", 0.0)
    if r.address is None and cpus >= total - 1e-9:  # the learner ranks and the retriever are placed at once
        raise ConfigError(
            f"the learner ranks and the retriever ask for {cpus:g} CPUs ({r.learner_ranks} x {r.learner_cpus:g} + "
            f"{r.retriever_replicas} x {r.retriever_cpus:g}) and this local cluster has {total:g}, leaving none to "
            "the rollout actors; lower ray.learner_cpus or ray.retriever_cpus")


class RayLearner:
    """The learner ranks (:class:`LearnerGroup`) behind the loop's learner interface; rank 0 answers."""

    def __init__(self, group: LearnerGroup, idle_threads: int | None = None):
        self.group, self.idle_threads = group, idle_threads  # a rank's torch threads in a step no rollout runs
        self._version = group.call("version")

    @property
    def version(self) -> int:
        return self._version

    def train_step(self, groups: list[Group], rollouts_idle: Callable[[], bool] | None = None) -> dict[str, float]:
        idle = (self.idle_threads, rollouts_idle) if self.idle_threads and rollouts_idle is not None else None
        learn = self.group.call("train_step", ray.put([to_arrow(groups)]), idle)  # one copy for all ranks
        self._version = int(learn["policy_version"])
        return learn

    def save_checkpoint(self, out_dir: Path, position: dict[str, Any], background: bool = False) -> str:
        return self.group.call("save_checkpoint", str(out_dir), position, background)

    def finish_writes(self) -> None:
        self.group.call("finish_writes")

    def load_latest(self, out_dir: Path) -> dict[str, Any] | None:
        position = self.group.call("load_latest", str(out_dir))
        self._version = self.group.call("version")
        return position


def start_rollout_actors(cfg: ZipRLConfig, model_path: Path, retriever: Any) -> list[Any]:
    """``ray.num_rollout_actors`` rollout actors, each with its own engine over ``model_path``."""
    cpus = rollout_cpus(cfg)
    return [
        RolloutActor.options(name=ROLLOUT_NAME.format(i), num_cpus=cpus, num_gpus=cfg.ray.rollout_gpus)
        .remote(cfg.to_dict(), str(model_path), retriever, i, cpu_threads(cpus))
        for i in range(cfg.ray.num_rollout_actors)
    ]


@dataclass(frozen=True)
class RefsFinished:
    """True once every one of ``refs`` (the rollout calls in flight when it was made) has finished; picklable, so a
    learner rank polls it during its step."""

    refs: list[ray.ObjectRef]

    def __call__(self) -> bool:
        n = len(self.refs)
        return n == 0 or len(ray.wait(self.refs, num_returns=n, timeout=0, fetch_local=False)[0]) == n


class RaySource:
    """Rollout actors running one job each (``rollout.batch_questions`` questions).

    ``weights`` is the run's weight push: a job is handed what it must load first (:meth:`RaySender.for_job`),
    so a job submitted after a push never runs on older weights, and an actor Ray restarted rejoins it.
    """

    def __init__(self, cfg: ZipRLConfig, actors: list[Any], weights: RaySender):
        self.actors, self.weights = actors, weights
        self.num_workers = len(self.actors)
        self.questions_per_call = cfg.rollout.batch_questions
        self._calls: dict[ray.ObjectRef, tuple[int, int]] = {}  # run_batch result -> (ticket, worker)

    def submit(self, worker: int, ticket: int, examples: list[QAExample], seed: int) -> None:
        call = self.actors[worker].run_batch.remote(example_dicts(examples), seed, self.weights.for_job())
        self._calls[call] = (ticket, worker)

    def wait(self) -> list[Completion]:
        ready, rest = ray.wait(list(self._calls), num_returns=1)
        if rest:  # everything else that has finished too
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        out = []
        for ref in ready:
            ticket, worker = self._calls.pop(ref)
            try:
                table, stats = ray.get(ref)
            except RayActorError as exc:  # the actor died mid-job; Ray restarts it, and it rejoins the weights
                error = str(exc).strip().splitlines()[-1][:500]
                try:
                    self._await_restart(worker)
                    self.weights.rejoin(worker, self.actors[worker])
                except RayError as again:  # it cannot come back (e.g. its constructor fails): the job fails again
                    error = str(again).strip().splitlines()[-1][:500]
                out.append(Completion(ticket, None, error=error))
                continue
            out.append(Completion(ticket, from_arrow(table), stats))
        return out

    def idle_probe(self) -> RefsFinished:
        return RefsFinished(list(self._calls))

    def _await_restart(self, worker: int, timeout_s: float = RESTART_TIMEOUT_S) -> None:
        """Block until Ray has restarted actor ``worker`` (its model reloaded); re-raise if it cannot start."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ray.get(self.actors[worker].pid.remote())
                return
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self._calls.clear()
