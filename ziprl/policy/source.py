"""Rollout sources: what the training loop's scheduler submits rollout jobs to.

A source runs jobs (G trajectories for each of a few questions) on ``num_workers`` workers and reports them
as :class:`Completion`s; it also pushes new weights to its workers. :class:`InProcessSource` is the one
``ziprl.train`` uses (one worker: this process's engine); ``ziprl.actors.driver.RaySource`` runs the same
jobs on Ray rollout actors.
"""

from __future__ import annotations

import resource
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ziprl.config import ZipRLConfig
from ziprl.env.search_env import SearchCompressEnv
from ziprl.env.trajectory import Trajectory
from ziprl.policy.engine import GenerationEngine
from ziprl.policy.rollout import rollout_groups
from ziprl.retrieval.types import QAExample

Group = list[Trajectory]


@dataclass
class Completion:
    """A finished job: its groups (one per question, in order), or None when its worker died mid-job."""

    ticket: int
    groups: list[Group] | None
    stats: dict[str, float] = field(default_factory=dict)  # tokens, gen_seconds, rss_peak_mb
    error: str = ""  # why the worker died, when it did


class RolloutSource(Protocol):
    """Runs rollout jobs on ``num_workers`` workers (one job at a time each) and pushes weights to them."""

    num_workers: int
    questions_per_call: int

    def submit(self, worker: int, ticket: int, examples: list[QAExample], seed: int) -> None:
        """Start a job on an idle worker: ``rollout.group_size`` trajectories per question, seeded by ``seed``."""

    def wait(self) -> list[Completion]:
        """Block until at least one submitted job has finished (or failed); return every finished one."""

    def sync_weights(self, version: int) -> dict[str, float]:
        """Give every worker the learner's weights of ``version`` before its next job; {"seconds", "bytes"}."""

    def close(self) -> None:
        """Release the workers."""


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def job_stats(engine: GenerationEngine, tokens0: int, seconds0: float) -> dict[str, float]:
    """Generation counters of one job (engine counters since ``tokens0``/``seconds0``) and peak memory."""
    return {"tokens": float(engine.tokens_generated - tokens0),
            "gen_seconds": engine.generation_seconds - seconds0, "rss_peak_mb": peak_rss_mb()}


class InProcessSource:
    """One worker, this process: a job runs when the loop waits for it, with the engine's weights at that time.

    All questions of a learner step go in one job (``learner.global_batch_questions``), so their episodes are
    generated as one batch. ``weights`` returns the learner's current weights (name -> array) for a push.
    """

    num_workers = 1

    def __init__(self, cfg: ZipRLConfig, engine: GenerationEngine, make_env: Callable[[], SearchCompressEnv],
                 weights: Callable[[], dict[str, Any]]):
        self.cfg, self.engine, self.make_env, self.weights = cfg, engine, make_env, weights
        self.questions_per_call = cfg.learner.global_batch_questions
        self._jobs: deque[tuple[int, list[QAExample], int]] = deque()

    def submit(self, worker: int, ticket: int, examples: list[QAExample], seed: int) -> None:
        self._jobs.append((ticket, examples, seed))

    def wait(self) -> list[Completion]:
        ticket, examples, seed = self._jobs.popleft()
        tokens, secs = self.engine.tokens_generated, self.engine.generation_seconds
        groups = rollout_groups(self.engine, self.make_env, examples, self.cfg.sampling, self.cfg.rollout.group_size,
                                seed)
        return [Completion(ticket, groups, job_stats(self.engine, tokens, secs))]

    def sync_weights(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        arrays = self.weights()
        self.engine.load_weights(arrays, version)
        return {"seconds": time.perf_counter() - t0, "bytes": float(sum(a.nbytes for a in arrays.values()))}

    def close(self) -> None:
        self._jobs.clear()
