"""Rollout sources: what the training loop's scheduler submits rollout jobs to, and what a finished job reports.

A source runs jobs (G trajectories for each of a few questions) on ``num_workers`` workers and reports them
as :class:`Completion`s; it never moves weights (the loop's :class:`~ziprl.weights.WeightSender` does).
:class:`ziprl.loop.in_process.InProcessSource` is the one ``ziprl.train`` uses (one worker: this process's
engine); ``ziprl.actors.driver.RaySource`` runs the same jobs on Ray rollout actors, which report
:func:`job_stats`.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ziprl.env.group import Group
from ziprl.policy.engine import GenerationEngine
from ziprl.retrieval.types import QAExample


@dataclass
class Completion:
    """A finished job: its groups (one per question, in order), or None when its worker died mid-job."""

    ticket: int
    groups: list[Group] | None
    stats: dict[str, float] = field(default_factory=dict)  # tokens, gen_seconds, rss_peak_mb
    error: str = ""  # why the worker died, when it did


class RolloutSource(Protocol):
    """Runs rollout jobs on ``num_workers`` workers (one job at a time each)."""

    num_workers: int
    questions_per_call: int

    def submit(self, worker: int, ticket: int, examples: list[QAExample], seed: int) -> None:
        """Start a job on an idle worker: one group per question (formed by ``rollout_groups``), seeded by ``seed``."""

    def wait(self) -> list[Completion]:
        """Block until at least one submitted job has finished (or failed); return every finished one."""

    def idle_probe(self) -> Callable[[], bool]:
        """A picklable callable that is true once none of the jobs submitted so far computes any more (a learner
        step polls it, possibly in another process, to take the cores they free)."""

    def close(self) -> None:
        """Release the workers."""


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def job_stats(engine: GenerationEngine, tokens0: int, seconds0: float) -> dict[str, float]:
    """Generation counters of one job (engine counters since ``tokens0``/``seconds0``) and peak memory."""
    return {"tokens": float(engine.tokens_generated - tokens0),
            "gen_seconds": engine.generation_seconds - seconds0, "rss_peak_mb": peak_rss_mb()}
