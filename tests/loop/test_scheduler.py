"""The rollout scheduler and its capacity rule, driven by a simulated pool of rollout workers.

The simulation completes jobs in a random order, kills workers mid-job at random (their jobs come back failed
and are re-run), and generates every group with the weights the worker had when the job started, as the Ray
rollout actors do. Over random layouts, every step completes, every generated group is trained exactly once,
and no trained group is ever more than ``max_staleness`` versions behind, with no stale drop at all.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ziprl.loop.capacity import capacity, is_fresh, lag
from ziprl.loop.scheduler import RolloutScheduler
from ziprl.loop.source import Completion
from ziprl.loop.stream import QuestionStream
from ziprl.testing.loop import QUESTIONS, SimulatedSource


def _run(workers, batch, group_size, staleness, per_call, death_p, seed, steps=4, bounded=False):
    source = SimulatedSource(workers, per_call, group_size, random.Random(seed), death_p)
    sched = RolloutScheduler(source, QuestionStream(QUESTIONS, seed), batch, staleness, seed=seed,
                             max_job_failures=10**6,  # random deaths may hit one job many times in a row
                             steps=steps if bounded else None)
    trained: list[str] = []
    for step in range(1, steps + 1):
        groups = sched.next_batch()
        assert len(groups) == batch
        assert all(len(g) == group_size for g in groups)
        assert max(sched.lags(groups)) <= staleness
        trained += [g.id for g in groups]
        source.version = step  # the loop pushes the new weights, then tells the scheduler
        sched.advance(step)
    return source, sched, trained


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(1, 64), batch=st.integers(1, 128), group_size=st.integers(1, 16),
       staleness=st.integers(0, 3), per_call=st.integers(1, 8), death_p=st.sampled_from([0.0, 0.05, 0.3]),
       seed=st.integers(0, 2**16))
@example(workers=2, batch=4, group_size=2, staleness=0, per_call=1, death_p=0.0, seed=0)  # old queue deadlock
@example(workers=64, batch=1, group_size=1, staleness=0, per_call=1, death_p=0.3, seed=1)  # many actors, on-policy
@example(workers=32, batch=64, group_size=8, staleness=1, per_call=1, death_p=0.05, seed=2)  # the paper's layout
def test_every_step_completes_and_no_group_is_lost_or_stale(workers, batch, group_size, staleness, per_call,
                                                            death_p, seed):
    source, sched, trained = _run(workers, batch, group_size, staleness, per_call, death_p, seed)
    c = sched.counters
    assert c["groups_trained"] == 4 * batch == len(trained)
    assert len(set(trained)) == len(trained), "a group was trained twice"
    buffered = [g.id for _, g, _ in sched._buffer]
    # accounting balances: generated = trained + dropped + buffered, each group in exactly one place
    assert c["groups_generated"] == len(source.generated) == c["groups_trained"] + c["groups_dropped_stale"] + len(buffered)
    assert sorted(source.generated) == sorted(trained + sched.dropped + buffered)
    assert c["groups_dropped_stale"] == 0  # the capacity rule + oldest-first consumption never makes one stale
    # the admission bound holds at the end: never more than (S + version + 1) * batch started and kept
    assert sched.capacity() >= 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(1, 64), batch=st.integers(1, 128), group_size=st.integers(1, 16),
       staleness=st.integers(0, 3), per_call=st.integers(1, 8), death_p=st.sampled_from([0.0, 0.05, 0.3]),
       seed=st.integers(0, 2**16), steps=st.integers(1, 5))
@example(workers=2, batch=1, group_size=2, staleness=1, per_call=1, death_p=0.0, seed=0, steps=2)  # the default launch
def test_a_run_of_known_length_generates_only_groups_it_trains(workers, batch, group_size, staleness, per_call,
                                                              death_p, seed, steps):
    # the run's last max_staleness batches used to be generated and thrown away, on cores the learner shares
    source, sched, trained = _run(workers, batch, group_size, staleness, per_call, death_p, seed, steps, bounded=True)
    assert sched.running == 0
    assert sched.buffered == 0
    assert not source.jobs
    assert sorted(source.generated) == sorted(trained)
    assert len(trained) == steps * batch
    assert sched.counters["groups_dropped_stale"] == 0


def test_a_resumed_run_of_known_length_generates_only_the_steps_left():
    source, sched, _ = _run(workers=3, batch=2, group_size=2, staleness=1, per_call=2, death_p=0.0, seed=4, steps=2)
    resumed_source = SimulatedSource(3, 2, 2, random.Random(5), 0.0)
    resumed_source.version = 2
    resumed = RolloutScheduler(resumed_source, QuestionStream(QUESTIONS, 4), 2, 1, seed=4, version=2, steps=3)
    resumed.restore(sched.position)  # the first run's jobs under way: more than one step's worth
    resumed.next_batch()
    resumed_source.version = 3
    resumed.advance(3)
    assert resumed.running == 0
    assert resumed.buffered == 0
    assert not resumed_source.jobs
    assert len(resumed_source.generated) == 2


def test_capacity_formula_and_lag():
    # AReaL: (max_staleness + version + 1) * batch - (accepted + running)
    assert capacity(1, 0, 64, 0, 0) == 128
    assert capacity(1, 3, 64, 280, 40) == 0
    assert capacity(1, 3, 64, 200, 40) == 80
    assert capacity(0, 2, 4, 12, 0) == 0
    assert capacity(1, 0, 64, 0, 0, steps=1) == 64
    assert capacity(1, 3, 64, 200, 40, steps=4) == 16
    assert lag(3, 5) == 2
    assert is_fresh(3, 5, 2)
    assert not is_fresh(3, 5, 1)
    assert is_fresh(5, 5, 0)
    assert not is_fresh(4, 5, 0)
    assert is_fresh(0, 5, 10)
    with pytest.raises(ValueError, match="newer than the learner"):
        lag(6, 5)
    with pytest.raises(ValueError, match="max_staleness"):
        is_fresh(1, 1, -1)


def test_on_policy_keeps_exactly_one_batch_in_flight():
    source, sched, _ = _run(workers=16, batch=8, group_size=2, staleness=0, per_call=1, death_p=0.0, seed=3)
    # at version v at most (v + 1) * batch groups were ever started: after 4 steps, one batch of version 4
    assert sched.running + sched.buffered <= 8
    assert {v for _, _, _, v in source.jobs.values()} <= {4}


def test_resume_reruns_untrained_jobs_with_their_seeds():
    source, sched, _ = _run(workers=3, batch=2, group_size=2, staleness=1, per_call=2, death_p=0.0, seed=4, steps=2)
    pos = sched.position
    pending = [(p["seed"], tuple(p["ids"])) for p in pos["pending"]]
    assert pending, "with max_staleness 1 the next batch is already under way"
    resumed_source = SimulatedSource(3, 2, 2, random.Random(5), 0.0)
    resumed_source.version = 2  # the loop pushes the checkpoint's weights before the first job
    resumed = RolloutScheduler(resumed_source, QuestionStream(QUESTIONS, 4), 2, 1, seed=4, version=2)
    resumed.restore(pos)
    resumed.next_batch()
    assert resumed_source.seeds[: len(pending)] == pending  # re-run first, same seeds, same questions
    resumed_source.version = 3
    resumed.advance(3)
    resumed.next_batch()
    # new work continues the dispatch counter where the first run stopped
    new = resumed_source.seeds[len(pending):]
    assert new
    assert new[0][0] == 4 * 1_000_003 + pos["dispatches"]


def test_a_job_that_returns_older_weights_than_promised_is_a_bug():
    class Lagging(SimulatedSource):
        def submit(self, worker, ticket, examples, seed):
            super().submit(worker, ticket, examples, seed)
            w, ex, s, _ = self.jobs[ticket]
            self.jobs[ticket] = (w, ex, s, 0)  # ignores pushed weights

    source = Lagging(2, 1, 1, random.Random(0), 0.0)
    sched = RolloutScheduler(source, QuestionStream(QUESTIONS, 0), 2, 0)
    sched.next_batch()
    source.version = 1
    sched.advance(1)
    with pytest.raises(RuntimeError, match="must apply pushed weights"):
        sched.next_batch()


def test_a_job_whose_workers_always_die_stops_the_run_with_the_reason():
    class Broken(SimulatedSource):
        def wait(self):
            done = [Completion(t, None, error="ImportError: no module named x") for t in self.jobs]
            self.jobs.clear()
            self.busy_workers.clear()
            return done

    sched = RolloutScheduler(Broken(2, 1, 1, random.Random(0), 0.0), QuestionStream(QUESTIONS, 0), 2, 0,
                             max_job_failures=3)
    with pytest.raises(RuntimeError, match="failed 3 times in a row.*ImportError: no module named x"):
        sched.next_batch()
    assert sched.counters["rollout_failures"] >= 3


def test_a_job_holding_one_question_twice_is_resumed_group_for_group():
    """One question per epoch, three to a job: each untrained group is re-run on resume, repeats included, so the
    resumed run trains what the first would have."""
    source = SimulatedSource(workers=1, per_call=3, group_size=2, rng=random.Random(0), death_p=0)
    sched = RolloutScheduler(source, QuestionStream(QUESTIONS[:1]), batch=1, max_staleness=2, steps=10)
    sched.next_batch()
    source.version = 1
    sched.advance(1)
    assert sched.buffered + sched.running == 3
    pos = sched.position
    assert pos["pending"] == [{"seed": 0, "ids": ["q0", "q0"]}, {"seed": 1, "ids": ["q0"]}]
    resumed_source = SimulatedSource(1, 3, 2, random.Random(1), 0.0)
    resumed_source.version = 1
    resumed = RolloutScheduler(resumed_source, QuestionStream(QUESTIONS[:1]), 1, 2, version=1, steps=10)
    resumed.restore(pos)
    groups = [resumed.next_batch()[0] for _ in range(3)]
    assert [g.question_id for g in groups] == ["q0"] * 3
    assert resumed_source.seeds[:2] == [(0, ("q0", "q0")), (1, ("q0",))]  # re-run first, same seeds, repeats kept
