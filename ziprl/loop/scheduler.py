"""Feeds the learner whole GRPO groups from a pool of rollout workers under the staleness-aware capacity rule.

The scheduler knows nothing of Ray or torch: a :class:`~ziprl.loop.source.RolloutSource` runs the jobs (in this process for
``ziprl.train``, on Ray rollout actors for ``ziprl.launch``, a simulation in the tests). Its rules:

- Admission (:func:`~ziprl.loop.capacity.capacity`): an idle worker gets a job of up to
  ``source.questions_per_call`` questions while fewer than ``(max_staleness + version + 1) * batch`` groups have
  been started and kept, and, in a run of ``steps`` learner steps, fewer than the ``steps * batch`` it trains. A
  job is tagged with the learner version at submission; the source guarantees its groups are generated with
  weights at least that new (weights are pushed before the next submission).
- Consumption, oldest version first: a batch takes finished groups in version order and never takes a group
  while a running job might still return an older one, so groups are trained in version order. With the
  admission bound, no group is ever too stale: if a group of version u were trained at step s > u + S + 1
  (S = max_staleness), the (s - 1) * batch groups trained before it would all have versions <= u, yet at most
  (S + u + 1) * batch groups are ever started at versions <= u. A stale group would still be dropped and
  counted, never trained.
- A job whose worker died comes back as a failed ``Completion``; its questions are re-run (same seed) on
  the next idle worker, first in line. Nothing is half-counted. A job that fails ``max_job_failures`` times in
  a row (a worker that cannot even start, say) stops the run with an error instead of retrying forever.
- ``position`` is the data position a checkpoint stores: the question stream plus every job not yet trained
  (buffered or running), which a resumed run re-runs first with the same seeds.
- Dynamic sampling (DAPO; ``keep`` given): a finished group ``keep`` rejects (no reward variance) is set aside, not
  buffered. Its question stays consumed (the stream moved past it; it is never pending) and its admission slot is
  freed, as AReaL frees a rejected rollout's, so more questions are drawn until ``batch`` kept groups are in hand.
  The staleness bound still holds for kept groups: at every admission kept + running groups stay within it. Once
  a batch has sampled ``max_rounds * batch`` groups (0: no limit) and fewer than ``batch`` are kept, the batch is
  filled up with the set-aside groups, oldest first. The set-aside groups not trained are handed to the loop
  (:meth:`take_zero_variance`) with the batch's sampling statistics.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ziprl.config import ConfigError
from ziprl.env.group import Group
from ziprl.loop.capacity import capacity, is_fresh, lag
from ziprl.loop.source import Completion, RolloutSource
from ziprl.loop.stream import QuestionStream
from ziprl.retrieval.types import QAExample

MAX_JOB_FAILURES = 5


@dataclass
class _Job:
    worker: int
    examples: list[QAExample]
    seed: int
    version: int  # learner version at submission: a lower bound on the version its groups carry
    started: float
    failures: int = 0  # times this job's worker died under it before


class RolloutScheduler:
    """Dispatch, collect and batch groups for the learner (see the module docstring for the rules)."""

    def __init__(self, source: RolloutSource, stream: QuestionStream, batch: int, max_staleness: int,
                 seed: int = 0, version: int = 0, max_job_failures: int = MAX_JOB_FAILURES,
                 steps: int | None = None, keep: Callable[[Group], bool] | None = None, max_rounds: int = 0):
        if batch < 1 or max_staleness < 0 or source.num_workers < 1 or source.questions_per_call < 1:
            raise ValueError(f"need batch >= 1, max_staleness >= 0 and at least one worker taking >= 1 question "
                             f"(batch={batch}, max_staleness={max_staleness}, workers={source.num_workers}, "
                             f"questions_per_call={source.questions_per_call})")
        self.source, self.stream, self.batch, self.max_staleness = source, stream, batch, max_staleness
        self.seed, self.version, self.max_job_failures, self.steps = seed, version, max_job_failures, steps
        self.keep, self.max_rounds = keep, max_rounds
        self._base = version * batch  # groups trained before this run started (resume)
        self._jobs: dict[int, _Job] = {}
        self._tickets = 0
        self._dispatches = 0
        self._retry: deque[tuple[list[QAExample], int, int]] = deque()  # (examples, seed, failures so far)
        self._buffer: list[tuple[int, Group, tuple[list[QAExample], int]]] = []  # (version, group, (job))
        self._rejected: list[tuple[int, Group]] = []  # (version, group) that keep rejected, since the last batch
        self._sampled = 0  # groups finished since the last batch
        self._zero_variance: list[Group] = []  # rejected groups of the last batch that it does not train
        self.sampling: dict[str, float] = {}  # dynamic sampling statistics of the last batch
        self._idle = set(range(source.num_workers))
        self.counters = {"groups_generated": 0, "groups_trained": 0, "groups_dropped_stale": 0, "rollout_failures": 0,
                         "groups_dropped_zero_variance": 0}
        self.dropped: list[str] = []  # group ids of stale drops (expected to stay empty)
        self._step_start = time.perf_counter()
        self._busy = 0.0  # worker-seconds of generation in the current step
        self._wait = 0.0  # seconds the learner waited for groups in the current step
        self._gen = {"tokens": 0.0, "gen_seconds": 0.0}
        self._rss: dict[int, float] = {}

    # ------------------------------------------------------------------ state

    @property
    def running(self) -> int:
        """Groups being generated now."""
        return sum(len(j.examples) for j in self._jobs.values())

    @property
    def buffered(self) -> int:
        """Finished groups waiting for a learner step."""
        return len(self._buffer)

    def capacity(self) -> int:
        accepted = self._base + self.counters["groups_trained"] + len(self._buffer)
        return capacity(self.max_staleness, self.version, self.batch, accepted, self.running, self.steps)

    @property
    def position(self) -> dict[str, Any]:
        """Data position for a checkpoint: the stream, and the jobs not yet trained (re-run first on resume).

        Each untrained group is in exactly one of buffer, running jobs and retries, so a job's ids are listed once
        per group: one question twice in a job (an epoch boundary) is re-run twice."""
        pending = [(list(ex), seed) for _, _, (ex, seed) in self._buffer]  # one entry per buffered group
        pending += [(j.examples, j.seed) for j in self._jobs.values()] + [(ex, seed) for ex, seed, _ in self._retry]
        merged: dict[int, list[str]] = {}
        for examples, seed in pending:
            merged.setdefault(seed, []).extend(e.id for e in examples)
        return {"stream": self.stream.position, "dispatches": self._dispatches,
                "pending": [{"seed": s, "ids": ids} for s, ids in sorted(merged.items())]}

    def restore(self, position: dict[str, Any]) -> None:
        """Continue from a checkpoint's position (an older checkpoint's bare stream position also works)."""
        if "stream" not in position:
            self.stream.restore(position)
            return
        self.stream.restore(position["stream"])
        self._dispatches = int(position["dispatches"])
        by_id = {e.id: e for e in self.stream.examples}
        for job in position["pending"]:
            missing = [i for i in job["ids"] if i not in by_id]
            if missing:
                raise ConfigError(f"checkpoint names questions {missing[:3]} that are not in this question set; "
                                 "resume with the same data config")
            self._retry.append(([by_id[i] for i in job["ids"]], int(job["seed"]), 0))

    # ------------------------------------------------------------------ the loop's calls

    def next_batch(self) -> list[Group]:
        """The next ``batch`` groups to train on (oldest version first), dispatching and waiting as needed.

        Never deadlocks: while fewer than ``batch`` groups are buffered or running, capacity is positive
        (``(max_staleness + 1) * batch - buffered - running > 0``), so some worker is always given work.
        """
        while True:
            self._drop_stale()
            self._fill()
            ready = self._ready(top_up=self._capped())
            if ready is not None:
                return self._hand_over(*ready)
            if not self._jobs:
                raise RuntimeError(f"scheduler stalled: nothing running, {self.buffered} groups buffered, "
                                   f"capacity {self.capacity()} (a bug: please report it)")
            t0 = time.perf_counter()
            done = self.source.wait()
            self._wait += time.perf_counter() - t0
            for c in done:
                self._complete(c)

    def advance(self, version: int) -> None:
        """The learner is now at ``version`` and every worker will generate with it from its next job on."""
        if version < self.version:
            raise ValueError(f"learner version went back from {self.version} to {version}")
        self.version = version
        self._fill()  # new capacity: start jobs right away, while the loop logs and checkpoints

    def waited(self, seconds: float) -> None:
        """Count ``seconds`` the learner waited for a rollout outside :meth:`next_batch` (an in-place weight push
        waiting for the job in flight) in this step's wait."""
        self._wait += seconds

    def idle_probe(self) -> Callable[[], bool]:
        """The source's probe of the jobs running now: true once all of them have finished (picklable, so a learner in
        another process can poll it during its step; no job starts before :meth:`advance`)."""
        return self.source.idle_probe()

    def take_zero_variance(self) -> list[Group]:
        """The zero-variance groups dynamic sampling set aside for the last batch and did not train (then forgotten)."""
        dropped, self._zero_variance = self._zero_variance, []
        return dropped

    def step_stats(self) -> dict[str, float]:
        """This step's system metrics (and the run's counters); resets the per-step timers."""
        now = time.perf_counter()
        wall = max(now - self._step_start, 1e-9)
        busy = self._busy + sum(now - max(j.started, self._step_start) for j in self._jobs.values())
        stats = {**{k: float(v) for k, v in self.counters.items()},
                 "groups_buffered": float(self.buffered), "groups_in_flight": float(self.running),
                 "queue_depth": float(self.buffered),
                 "actor_idle_frac": max(0.0, 1.0 - busy / (wall * self.source.num_workers)),
                 "learner_wait_frac": min(1.0, self._wait / wall), "wait_seconds": self._wait,
                 "gen_tokens": self._gen["tokens"], "gen_seconds": self._gen["gen_seconds"],
                 "rollout_rss_peak_mb": max(self._rss.values(), default=0.0)}
        self._step_start, self._busy, self._wait = now, 0.0, 0.0
        self._gen = {"tokens": 0.0, "gen_seconds": 0.0}
        return stats

    # ------------------------------------------------------------------ internals

    def _fill(self) -> None:
        """Give idle workers jobs while the capacity rule allows (re-runs of failed or resumed jobs first)."""
        while self._idle:
            room = self.capacity()
            failures = 0
            if self._retry:
                examples, seed, failures = self._retry[0]
                if len(examples) > room:
                    return
                self._retry.popleft()
            else:
                n = min(room, self.source.questions_per_call)
                if n <= 0:
                    return
                examples, seed = self.stream.next_batch(n), self.seed * 1_000_003 + self._dispatches
                self._dispatches += 1
            worker = min(self._idle)
            self._idle.discard(worker)
            ticket, self._tickets = self._tickets, self._tickets + 1
            self._jobs[ticket] = _Job(worker, examples, seed, self.version, time.perf_counter(), failures)
            self.source.submit(worker, ticket, examples, seed)

    def _complete(self, c: Completion) -> None:
        job = self._jobs.pop(c.ticket)
        self._idle.add(job.worker)
        self._busy += time.perf_counter() - max(job.started, self._step_start)
        if c.groups is None:
            self.counters["rollout_failures"] += 1
            if job.failures + 1 >= self.max_job_failures:
                raise RuntimeError(f"a rollout job failed {self.max_job_failures} times in a row (its workers died each "
                                   f"time{': ' + c.error if c.error else ''}); see the rollout actors' logs")
            self._retry.appendleft((job.examples, job.seed, job.failures + 1))
            return
        asked, got = [e.id for e in job.examples], [g.question_id for g in c.groups]
        if got != asked:
            raise RuntimeError(f"a rollout job for questions {asked[:3]} ({len(asked)}) returned groups of {got[:3]} "
                               f"({len(got)}): one group per question, in order")
        for ex, group in zip(job.examples, c.groups, strict=True):
            version = group.version
            if version < job.version:
                raise RuntimeError(f"a job submitted at policy version {job.version} returned a group of version "
                                   f"{version}: the rollout source must apply pushed weights before the next job")
            self._sampled += 1
            if self.keep is None or self.keep(group):
                self._buffer.append((version, group, ([ex], job.seed)))
            else:
                self._rejected.append((version, group))
        self.counters["groups_generated"] += len(c.groups)
        for key in self._gen:
            self._gen[key] += float(c.stats.get(key, 0.0))
        if "rss_peak_mb" in c.stats:
            self._rss[job.worker] = max(self._rss.get(job.worker, 0.0), float(c.stats["rss_peak_mb"]))

    def _drop_stale(self) -> None:
        keep = []
        for item in self._buffer:
            if is_fresh(item[0], self.version, self.max_staleness):
                keep.append(item)
            else:
                self.counters["groups_dropped_stale"] += 1
                self.dropped.append(item[1].id)
        self._buffer = keep

    def _ready(self, top_up: bool = False) -> tuple[list[Group], int] | None:
        """``batch`` groups, oldest version first, none newer than what a running job may still return; with
        ``top_up`` every such kept group, then rejected (fresh) ones, oldest first, up to ``batch``. Also how many
        rejected ones it took."""
        floor = min((j.version for j in self._jobs.values()), default=None)
        eligible = sorted((i for i, item in enumerate(self._buffer) if floor is None or item[0] <= floor),
                          key=lambda i: self._buffer[i][0])
        fill: list[int] = []
        if top_up:
            fill = sorted((i for i, (v, _) in enumerate(self._rejected)
                           if (floor is None or v <= floor) and is_fresh(v, self.version, self.max_staleness)),
                          key=lambda i: self._rejected[i][0])[: max(0, self.batch - len(eligible))]
        if len(eligible) + len(fill) < self.batch:
            return None
        take, filled = set(eligible[: self.batch]), set(fill)
        groups = [self._buffer[i][1] for i in sorted(take, key=lambda i: self._buffer[i][0])]
        groups += [self._rejected[i][1] for i in fill]
        self._buffer = [item for i, item in enumerate(self._buffer) if i not in take]
        self._rejected = [item for i, item in enumerate(self._rejected) if i not in filled]
        self.counters["groups_trained"] += len(groups)
        return groups, len(fill)

    def _capped(self) -> bool:
        """Whether dynamic sampling has sampled its limit for this batch without keeping ``batch`` groups."""
        return (self.keep is not None and self.max_rounds > 0 and self._sampled >= self.max_rounds * self.batch
                and len(self._buffer) < self.batch)

    def _hand_over(self, groups: list[Group], filled: int) -> list[Group]:
        """Close the batch's sampling (``filled``: rejected groups it trains): its statistics, and its rejected
        groups not trained become dropped."""
        rejected = len(self._rejected) + filled
        self.sampling = {"groups_sampled": float(self._sampled), "groups_kept": float(self._sampled - rejected),
                         "zero_variance_frac_sampled": rejected / self._sampled if self._sampled else 0.0,
                         "sample_rounds": self._sampled / self.batch, "zero_variance_groups_trained": float(filled)}
        self._zero_variance += [g for _, g in self._rejected]
        self.counters["groups_dropped_zero_variance"] += len(self._rejected)
        self._rejected, self._sampled = [], 0
        return groups

    def lags(self, groups: list[Group]) -> list[int]:
        """Lag of each group against the current learner version."""
        return [lag(g.version, self.version) for g in groups]
