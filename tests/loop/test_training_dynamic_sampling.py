"""Dynamic sampling (rollout.dynamic_sampling, DAPO's / verl's filter_groups): every learner step trains exactly
``learner.global_batch_questions`` groups whose reward varies, refilled from the question stream; off, nothing
changes; ``rollout.max_sample_rounds`` stops a stream without signal with a warning; a resumed run goes on as the
straight one. Rollouts come from the scheduler tests' simulated workers, with rewards set per question.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ziprl.config import ConfigError, load_config
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory, Turn, load_trajectories
from ziprl.loop.in_process import nothing_runs
from ziprl.loop.scheduler import RolloutScheduler
from ziprl.loop.stream import QuestionStream
from ziprl.loop.training import has_variance, train_loop
from ziprl.testing.learner import requires_deepspeed
from ziprl.testing.loop import QUESTIONS, SimulatedSource, train_cfg


def varied(question_id: str) -> bool:
    """Every third question is one the policy sometimes solves."""
    return int(question_id[1:]) % 3 == 0


class RewardedSource(SimulatedSource):
    """Simulated workers whose groups earn rewards: 0/1 alternating for a :func:`varied` question (unless
    ``all_zero``), else 0 for every sample."""

    def __init__(self, workers=1, per_call=2, group_size=2, seed=0, death_p=0.0, all_zero=False):
        super().__init__(workers, per_call, group_size, random.Random(seed), death_p)
        self.all_zero = all_zero

    def wait(self):
        done = super().wait()
        for c in done:
            for t in (t for g in c.groups or [] for t in g):
                t.reward = float(t.sample_index % 2) if varied(t.question_id) and not self.all_zero else 0.0
        return done

    def idle_probe(self):
        return nothing_runs  # the loop's learner step never runs beside a simulated job


class Crash(Exception):
    """The run died (the learner's machine, say)."""


class FakeLearner:
    """Records each step's groups (by question); checkpoints the version and data position as JSON; with
    ``crash_at`` the run dies when that step starts."""

    def __init__(self, crash_at=None):
        self.version, self.crash_at = 0, crash_at
        self.steps: list[list[Group]] = []

    def train_step(self, groups, rollouts_idle=None):
        if self.version + 1 == self.crash_at:
            raise Crash
        self.steps.append(list(groups))
        self.version += 1
        return {"loss": 0.0, "policy_version": float(self.version)}

    def save_checkpoint(self, out_dir, position, background=False):
        (out_dir / "ckpt.json").write_text(json.dumps({"version": self.version, "position": position}))
        return "ckpt.json"

    def load_latest(self, out_dir):
        path = out_dir / "ckpt.json"
        if not path.is_file():
            return None
        saved = json.loads(path.read_text())
        self.version = saved["version"]
        return saved["position"]


class FakePush:
    def __init__(self, source):
        self.source = source

    def push(self, version):
        self.source.version = version  # the workers generate with the new weights from their next job
        return {"seconds": 0.0, "bytes": 0.0}


class FakeLogger:
    def __init__(self):
        self.lines: list[tuple[int, dict[str, float]]] = []

    def open(self, first_step):
        pass

    def log(self, step, metrics):
        self.lines.append((step, metrics))


def _cfg(out, *extra, steps=4):
    return load_config(None, [f"run.out_dir={out}", f"learner.steps={steps}", "learner.global_batch_questions=2",
                              "rollout.group_size=2", "ray.max_staleness=0", *extra])


def _train(cfg, source, learner=None):
    learner, logger = learner or FakeLearner(), FakeLogger()
    train_loop(cfg, learner, source, FakePush(source), QuestionStream(QUESTIONS, cfg.data.seed), logger,
               progress=False)
    return learner, logger


def test_every_step_trains_exactly_a_batch_of_groups_with_reward_variance(tmp_path):
    source = RewardedSource()
    learner, _ = _train(_cfg(tmp_path, "rollout.dynamic_sampling=true"), source)
    assert len(learner.steps) == 4
    for groups in learner.steps:
        assert len(groups) == 2
        assert all(varied(g.question_id) for g in groups)
        assert all({t.reward for t in g} == {0.0, 1.0} for g in groups)
    files = sorted((tmp_path / "trajectories" / "dropped").glob("step_*.parquet"))
    dropped = [t for f in files for t in load_trajectories(f)]
    assert dropped
    assert not any(varied(t.question_id) for t in dropped)
    # nothing sampled is lost: every group the workers ran was trained or written whole to a dropped file
    trained = [g.id for groups in learner.steps for g in groups]
    assert sorted(trained + sorted({t.group_id for t in dropped})) == sorted(source.generated)
    assert len(dropped) == 2 * len({t.group_id for t in dropped})


def test_the_step_metrics_report_what_was_sampled_and_kept(tmp_path):
    _, logger = _train(_cfg(tmp_path, "rollout.dynamic_sampling=true"), RewardedSource())
    for step, m in logger.lines:
        sampled, kept = m["rollout/groups_sampled"], m["rollout/groups_kept"]
        assert kept == 2, step  # S = 0, one worker: each step samples until exactly its batch varies
        assert sampled >= kept
        assert m["rollout/zero_variance_frac_sampled"] == pytest.approx(1 - kept / sampled)
        assert m["rollout/sample_rounds"] == pytest.approx(sampled / 2)
        assert m["rollout/zero_variance_groups_trained"] == 0
        assert m["learner/loss"] == 0.0
    assert sum(m["rollout/groups_sampled"] for _, m in logger.lines) > 8  # it had to draw more than 4 x 2 questions
    assert logger.lines[-1][1]["system/groups_dropped_zero_variance"] == \
        sum(m["rollout/groups_sampled"] - m["rollout/groups_kept"] for _, m in logger.lines)


def test_off_every_drawn_question_trains_in_stream_order_and_nothing_is_dropped(tmp_path):
    learner, logger = _train(_cfg(tmp_path), RewardedSource())
    trained = [g.question_id for groups in learner.steps for g in groups]
    assert trained == [e.id for e in QuestionStream(QUESTIONS, 0).next_batch(8)]
    assert any(not varied(q) for q in trained)  # zero-variance groups train, as before
    assert not (tmp_path / "trajectories" / "dropped").exists()
    assert "rollout/groups_sampled" not in logger.lines[-1][1]
    assert logger.lines[-1][1]["system/groups_dropped_zero_variance"] == 0


def test_the_round_limit_stops_a_stream_without_signal_with_a_warning(tmp_path, capsys):
    cfg = _cfg(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_sample_rounds=3", steps=2)
    learner, logger = _train(cfg, RewardedSource(all_zero=True))
    assert [len(groups) for groups in learner.steps] == [2, 2]  # both steps ran, each on a full batch
    for _, m in logger.lines:
        assert m["rollout/groups_sampled"] == 6  # 3 rounds x 2 questions, then it stopped drawing
        assert m["rollout/sample_rounds"] == 3
        assert m["rollout/groups_kept"] == 0
        assert m["rollout/zero_variance_frac_sampled"] == 1
        assert m["rollout/zero_variance_groups_trained"] == 2
    assert len(load_trajectories(tmp_path / "trajectories" / "dropped" / "step_000001.parquet")) == 4 * 2
    err = capsys.readouterr().err
    assert "step 1 sampled 6 groups (rollout.max_sample_rounds=3 x 2) and only 0 varied in reward" in err
    assert "step 2 sampled 6 groups" in err


def test_a_run_resumed_after_a_crash_trains_what_the_straight_run_trains(tmp_path):
    extra = ("rollout.dynamic_sampling=true", "ray.max_staleness=1")
    straight, _ = _train(_cfg(tmp_path / "a", *extra), RewardedSource())
    crashed = FakeLearner(crash_at=3)
    with pytest.raises(Crash):
        _train(_cfg(tmp_path / "b", *extra), RewardedSource(), crashed)
    position = json.loads((tmp_path / "b" / "ckpt.json").read_text())["position"]
    assert position["pending"]  # step 3's groups were under way: the resumed run re-runs them first
    resumed, _ = _train(_cfg(tmp_path / "b", *extra, "run.resume=true"), RewardedSource())
    assert len(resumed.steps) == 2
    questions = [sorted(g.question_id for g in groups) for groups in straight.steps]
    assert [sorted(g.question_id for g in groups) for groups in crashed.steps + resumed.steps] == questions
    assert all(varied(q) for step in questions for q in step)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(1, 16), batch=st.integers(1, 16), staleness=st.integers(0, 2), per_call=st.integers(1, 4),
       death_p=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 2**16))
def test_any_layout_trains_only_full_batches_of_fresh_groups_with_variance(workers, batch, staleness, per_call,
                                                                           death_p, seed):
    source = RewardedSource(workers, per_call, 2, seed, death_p)
    sched = RolloutScheduler(source, QuestionStream(QUESTIONS, seed), batch, staleness, seed=seed,
                             max_job_failures=10**6, keep=lambda g: has_variance(g, "reward"))
    trained, dropped = [], []
    for step in range(1, 4):
        groups = sched.next_batch()
        assert len(groups) == batch
        assert all(has_variance(g, "reward") for g in groups)
        assert max(sched.lags(groups)) <= staleness
        trained += [g.id for g in groups]
        dropped += [g.id for g in sched.take_zero_variance()]
        source.version = step
        sched.advance(step)
    buffered = [g.id for _, g, _ in sched._buffer]
    assert sorted(source.generated) == sorted(trained + dropped + buffered)  # each group in exactly one place
    assert sched.counters["groups_dropped_zero_variance"] == len(dropped)
    assert sched.counters["groups_dropped_stale"] == 0


@pytest.mark.parametrize("metric", ["reward", "em", "f1"])
def test_a_group_varies_in_the_chosen_metric_only(metric):
    same = [Trajectory(question_id="q", question="?", answers=["a"], group_id="g", reward=0.5, em=0.0, f1=0.25)
            for _ in range(3)]
    assert not has_variance(Group(tuple(same)), metric)
    setattr(same[1], metric, 1.0)
    assert has_variance(Group(tuple(same)), metric)
    assert not has_variance(Group(tuple(same[1:2])), metric)  # one trajectory never varies


def test_the_advantage_metric_keeps_a_group_whose_hrr_term_varies_only_when_w_is_not_zero():
    same = [Trajectory(question_id="q", question="?", answers=["a"], group_id="g", reward=1.0,
                       turns=[Turn(q_com=0.3), Turn(q_com=q)]) for q in (0.3, 0.9)]
    assert not has_variance(Group(tuple(same)), "reward")
    assert not has_variance(Group(tuple(same)), "advantage", w=0.0)  # w = 0: the same as reward
    assert has_variance(Group(tuple(same)), "advantage", w=0.2)
    same[0].reward = 0.0
    assert has_variance(Group(tuple(same)), "advantage", w=0.0)


class ScoredSource(RewardedSource):
    """:class:`RewardedSource` whose trajectories have two turns scored Q_com 0.2 and 0.6."""

    def wait(self):
        done = super().wait()
        for t in (t for c in done for g in c.groups or [] for t in g):
            t.turns = [Turn(q_com=q, q_ratio=q, q_level=q, q_info=q, q_sem=q, level=1) for q in (0.2, 0.6)]
        return done


@pytest.mark.parametrize(("w", "all_kept"), [(0.0, False), (0.2, True)])
def test_the_loop_keeps_groups_by_their_advantages_under_the_runs_hrr_weight(tmp_path, w, all_kept):
    cfg = _cfg(tmp_path, "rollout.dynamic_sampling=true", "rollout.dynamic_sampling_metric=advantage",
               f"learner.hrr_weight={w}")
    learner, _ = _train(cfg, ScoredSource())
    trained = [g for groups in learner.steps for g in groups]
    assert len(trained) == 8
    assert all(varied(g.question_id) for g in trained) != all_kept  # w = 0: only groups whose rewards differ
    assert (tmp_path / "trajectories" / "dropped").is_dir() != all_kept


@pytest.mark.parametrize(("overrides", "needle"), [
    (["rollout.dynamic_sampling_metric=q_com"], "rollout.dynamic_sampling_metric must be reward, em, f1 or advantage, got 'q_com'"),
    (["rollout.max_sample_rounds=-1"], "rollout.max_sample_rounds must be >= 0 (0 = no limit), got -1"),
    (["rollout.dynamic_sampling=true", "rollout.group_size=1"], "rollout.dynamic_sampling=true keeps only groups"),
])
def test_bad_settings_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_the_edges_validate():
    cfg = load_config(None, ["rollout.dynamic_sampling=true", "rollout.group_size=2", "rollout.max_sample_rounds=0",
                             "rollout.dynamic_sampling_metric=f1"])
    assert cfg.rollout.dynamic_sampling


@pytest.mark.slow
@requires_deepspeed
def test_ziprl_train_samples_dynamically_with_its_engine(tiny_model_dir, tmp_path, capsys):
    """The in-process source runs the refill jobs (fewer questions than a batch) on the real engine; the tiny
    model's groups earn equal rewards, so the round limit fills each step up."""
    from ziprl.loop.in_process import train

    cfg = train_cfg(tiny_model_dir, tmp_path, 2)
    cfg.rollout.dynamic_sampling, cfg.rollout.max_sample_rounds = True, 2
    metrics = train(cfg, progress=False)
    sampled, kept = metrics["rollout/groups_sampled"], metrics["rollout/groups_kept"]
    assert sampled >= 2
    assert metrics["rollout/zero_variance_groups_trained"] == max(0, 2 - kept)
    assert len(load_trajectories(tmp_path / "trajectories" / "step_000002.parquet")) == 2 * 2  # a full batch
    dropped = tmp_path / "trajectories" / "dropped" / "step_000002.parquet"
    assert (len(load_trajectories(dropped)) if dropped.is_file() else 0) == 2 * (sampled - 2)
    if kept < 2:
        assert "step 2 sampled" in capsys.readouterr().err
