"""The one training loop (the paper's Algorithm 1, Stage 2): groups -> learner step -> weight push -> log.

``ziprl.train`` and ``ziprl.launch`` both run :func:`train_loop`; they differ only in the rollout source, the
weight push (this process's engine, or Ray rollout actors) and the learner (a :class:`LocalLearner`, or the Ray
learner ranks) they plug in. Each step: the scheduler hands over ``learner.global_batch_questions`` groups (admitted under
the staleness-aware capacity rule, oldest version first), the trajectories are written to
``<out>/trajectories/step_<n>.parquet``, the learner takes one optimiser step, the new weights are pushed to
every rollout worker, and the metrics go to TensorBoard; every ``run.checkpoint_every`` steps a checkpoint stores
the weights, optimiser and the data position (question stream + the jobs not yet trained). A step's metrics row is
logged before its checkpoint is written, so no checkpoint holds a step whose row is missing (a resume from an older
checkpoint re-logs the later rows); ``perf/save_seconds`` is therefore the checkpoint written after the previous
step, ``perf/trajectories_seconds`` the step's trajectory files, and ``perf/step_seconds`` the time from one row to
the next. SIGINT and SIGTERM stop the loop with such a
checkpoint where it is exact (:mod:`ziprl.loop.stop`); a step checkpointed already is not written again.

With ``rollout.dynamic_sampling`` (DAPO's dynamic sampling, verl's ``filter_groups``) the scheduler keeps only
groups whose ``rollout.dynamic_sampling_metric`` varies across their G trajectories (``advantage``: groups in which
some turn's advantage is non-zero) and draws more questions until the batch is full, so the step trains on
exactly ``learner.global_batch_questions`` groups with signal (up to ``rollout.max_sample_rounds`` batches' worth
sampled; then it fills up with zero-variance groups and warns). The groups it dropped are written to
``<out>/trajectories/dropped/step_<n>.parquet``, and ``rollout/groups_sampled``, ``groups_kept``,
``zero_variance_frac_sampled`` (before the filter), ``sample_rounds`` and ``zero_variance_groups_trained`` are
logged.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from ziprl.config import ConfigError, ZipRLConfig
from ziprl.env.group import Group, save_groups
from ziprl.env.stats import trajectory_stats
from ziprl.learner.advantages import carries_signal
from ziprl.loop.scheduler import RolloutScheduler
from ziprl.loop.source import RolloutSource, peak_rss_mb
from ziprl.loop.stop import Stop, StoppableSource, StopSignals
from ziprl.loop.stream import QuestionStream
from ziprl.policy.side_stream import CAPTURE_LOCK
from ziprl.weights import WeightSender


class Learner(Protocol):
    """What the loop needs of a learner (in-process Trainer or the Ray learner ranks)."""

    @property
    def version(self) -> int: ...

    def train_step(self, groups: list[Group], rollouts_idle: Callable[[], bool] | None = None) -> dict[str, float]:
        """One optimiser step on ``groups`` (as the rollout formed them); ``rollouts_idle`` (picklable) turns true
        once no rollout runs any more: a learner sharing cores with the rollout workers may then take theirs, for the
        rest of the step."""
        ...

    def save_checkpoint(self, out_dir: Path, position: dict[str, Any], background: bool = False) -> str:
        """Checkpoint; with ``background`` the write may go on beside the next step (the next save or load waits
        for it), else it is whole on return."""
        ...

    def finish_writes(self) -> None:
        """Wait until a background checkpoint write is whole (raising its error)."""
        ...

    def load_latest(self, out_dir: Path) -> dict[str, Any] | None: ...


class LocalLearner:
    """A :class:`~ziprl.learner.trainer.Trainer` in this process, with its checkpoints."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    @property
    def version(self) -> int:
        return self.trainer.policy_version

    def train_step(self, groups: list[Group], rollouts_idle: Callable[[], bool] | None = None) -> dict[str, float]:
        # generation runs in this process too (in the loop's wait, or on the source's thread beside the step with
        # rollout.overlap): its threads are already the process's, none to take; a graph capture there waits for
        # the step (CAPTURE_LOCK)
        with CAPTURE_LOCK:
            return {**self.trainer.train_step(groups), "rss_peak_mb": peak_rss_mb()}

    def save_checkpoint(self, out_dir: Path, position: dict[str, Any], background: bool = False) -> str:
        from ziprl.learner.checkpoint import save_checkpoint

        # in this process a write thread would take the cores generation and the step use: written at once
        with CAPTURE_LOCK:
            return str(save_checkpoint(self.trainer, out_dir, position))

    def finish_writes(self) -> None:
        """Nothing to wait for: this learner's checkpoints are whole on return."""

    def load_latest(self, out_dir: Path) -> dict[str, Any] | None:
        from ziprl.learner.checkpoint import latest_checkpoint, load_checkpoint

        ckpt = latest_checkpoint(out_dir)
        return None if ckpt is None else load_checkpoint(self.trainer, ckpt)


def step_metrics(groups: list[Group], learn: dict[str, float], system: dict[str, float], lags: list[int],
                 max_staleness: int, timings: dict[str, float], push: dict[str, float]) -> dict[str, float]:
    """Everything logged for one step: rollout/*, learner/*, perf/* and system/* scalars."""
    hist = Counter(lags)
    return {**{f"rollout/{k}": v for k, v in trajectory_stats([t for g in groups for t in g]).items()},
            **{f"learner/{k}": v for k, v in learn.items()},
            "perf/gen_tokens_per_second": system["gen_tokens"] / max(system["gen_seconds"], 1e-9),
            "perf/weight_push_seconds": push["seconds"], "perf/weight_push_bytes": push["bytes"],
            **{f"perf/{k}_seconds": v for k, v in timings.items()},
            **{f"system/{k}": v for k, v in system.items() if k not in ("gen_tokens", "gen_seconds")},
            "system/staleness": sum(lags) / len(lags) if lags else 0.0,
            **{f"system/lag_{k}_groups": float(hist[k]) for k in range(max_staleness + 1)},
            "system/driver_rss_peak_mb": peak_rss_mb()}


def has_variance(group: Group, metric: str, w: float = 0.0) -> bool:
    """Whether ``metric`` (reward, em or f1) differs across the group's trajectories: a group GRPO learns from;
    ``advantage``: whether some turn's advantage under HRR weight ``w`` is non-zero (:func:`carries_signal`)."""
    if metric == "advantage":
        return carries_signal(group, w)
    values = [getattr(t, metric) for t in group]
    return max(values) > min(values)


def train_loop(cfg: ZipRLConfig, learner: Learner, source: RolloutSource, push: WeightSender, stream: QuestionStream,
               logger: Any, progress: bool = True) -> dict[str, float]:
    """Train until ``cfg.learner.steps`` policy versions (resuming first when ``cfg.run.resume``); last metrics."""
    out = Path(cfg.run.out_dir)
    position = learner.load_latest(out) if cfg.run.resume else None
    if cfg.run.resume and position is None:
        raise ConfigError(f"run.resume is set but {out} holds no checkpoint to resume; drop --resume to start afresh")
    version = learner.version
    logger.open(version + 1)  # an output that cannot be written fails here, before a step is trained
    if version:  # resumed: the workers start from the checkpoint's weights
        push.push(version)
    ro = cfg.rollout
    keep = (functools.partial(has_variance, metric=ro.dynamic_sampling_metric, w=cfg.learner.hrr_weight)
            if ro.dynamic_sampling else None)
    with StopSignals() as stop:
        sched = RolloutScheduler(StoppableSource(source, stop), stream, cfg.learner.global_batch_questions,
                                 cfg.ray.max_staleness, seed=cfg.learner.seed, version=version, steps=cfg.learner.steps,
                                 keep=keep, max_rounds=ro.max_sample_rounds)
        if position is not None:
            sched.restore(position)
            print(f"[train] resumed from {out / 'checkpoints'} at step {version}", flush=True)
        bar = tqdm(total=cfg.learner.steps, initial=version, desc="train", unit="step", disable=not progress)
        # the step the newest checkpoint holds, and its path: a stop after it does not write that step again
        saved = {"version": version if position is not None else None, "path": str(out / "checkpoints")}
        try:
            metrics = _steps(cfg, learner, push, sched, logger, bar, out, stop, saved)
        except Stop as exc:
            if exc.checkpoint:
                if saved["version"] == learner.version:
                    learner.finish_writes()
                else:
                    saved["path"] = learner.save_checkpoint(out, sched.position)
                print(f"\n[train] stopped at step {learner.version}: checkpoint {saved['path']}", flush=True)
            else:
                print(f"\n[train] stopped without a checkpoint of this step; --resume continues from the last one in "
                      f"{out / 'checkpoints'}", flush=True)
            raise
        finally:
            bar.close()
    return metrics


def _steps(cfg: ZipRLConfig, learner: Learner, push: WeightSender, sched: RolloutScheduler, logger: Any,
           bar: tqdm, out: Path, stop: StopSignals, saved: dict[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    version, t_step, save_seconds = learner.version, time.perf_counter(), 0.0
    while version < cfg.learner.steps:
        groups = sched.next_batch()
        lags = sched.lags(groups)
        t0 = time.perf_counter()
        learn = learner.train_step(groups, rollouts_idle=sched.idle_probe())
        t1 = time.perf_counter()
        version = learner.version
        pushed = push.push(version)
        waited = pushed.get("wait_seconds", 0.0)  # for the job in flight (rollout.overlap=thread)
        sched.waited(waited)
        sched.advance(version)
        t2 = time.perf_counter()
        save_groups(groups, out / "trajectories" / f"step_{version:06d}.parquet")
        dropped = sched.take_zero_variance()
        if dropped:
            save_groups(dropped, out / "trajectories" / "dropped" / f"step_{version:06d}.parquet")
        timings = {"train": t1 - t0, "push": t2 - t1 - waited, "trajectories": time.perf_counter() - t2,
                   "save": save_seconds}
        system = sched.step_stats()
        timings["wait"] = system["wait_seconds"]
        timings["step"], t_step = time.perf_counter() - t_step, time.perf_counter()
        metrics = step_metrics(groups, learn, system, lags, cfg.ray.max_staleness, timings, pushed)
        if cfg.rollout.dynamic_sampling:
            metrics.update(_sampling_metrics(sched.sampling, cfg, version))
        logger.log(version, metrics)  # before the checkpoint: a kill between the two loses no row
        save_seconds = 0.0
        if version % cfg.run.checkpoint_every == 0 or version == cfg.learner.steps:
            # written beside the next step; the run's last checkpoint is whole before the loop returns
            t3 = time.perf_counter()
            saved["path"] = learner.save_checkpoint(out, sched.position, background=version < cfg.learner.steps)
            saved["version"], save_seconds = version, time.perf_counter() - t3
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['rollout/reward']:.2f}", q_com=f"{metrics['rollout/q_com']:.2f}",
                        loss=f"{learn.get('loss', float('nan')):.4f}", buffered=int(system["groups_buffered"]))
        stop.check()  # a SIGINT or SIGTERM since the wait for this batch stops the run here
    return metrics


def _sampling_metrics(sampling: dict[str, float], cfg: ZipRLConfig, step: int) -> dict[str, float]:
    """A step's dynamic sampling statistics as ``rollout/*`` metrics; warns when the step ran out of samples."""
    if sampling["zero_variance_groups_trained"]:
        print(f"[train] warning: step {step} sampled {sampling['groups_sampled']:.0f} groups "
              f"(rollout.max_sample_rounds={cfg.rollout.max_sample_rounds} x {cfg.learner.global_batch_questions}) "
              f"and only {sampling['groups_kept']:.0f} varied in {cfg.rollout.dynamic_sampling_metric}; it trains "
              f"{sampling['zero_variance_groups_trained']:.0f} zero-variance groups too. Raise "
              "rollout.max_sample_rounds or give the task questions the policy sometimes solves", file=sys.stderr,
              flush=True)
    return {f"rollout/{k}": v for k, v in sampling.items()}
