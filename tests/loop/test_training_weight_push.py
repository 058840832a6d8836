"""The loop's weight push: the training loop pushes every new version (and a resumed one first) through the
:class:`~ziprl.weights.WeightSender` it is given (the in-process push itself: tests/weights/test_in_process.py)."""

from __future__ import annotations

import pytest

from ziprl.config import load_config
from ziprl.loop.stream import QuestionStream
from ziprl.loop.training import train_loop
from ziprl.retrieval.types import QAExample
from ziprl.testing.loop import CountingLearner, OneWorker, RecordingLogger, RecordingPush

QUESTIONS = [QAExample(id=f"q{i}", question=f"question {i}?", answers=[str(i)]) for i in range(6)]


def test_the_loop_pushes_every_new_version_and_trains_on_it(tmp_path):
    cfg = load_config(None, [f"run.out_dir={tmp_path}", "learner.steps=3", "learner.global_batch_questions=2",
                             "ray.max_staleness=0"])
    push, learner, logger = RecordingPush(), CountingLearner(), RecordingLogger()
    metrics = train_loop(cfg, learner, OneWorker(push), push, QuestionStream(QUESTIONS), logger, progress=False)
    assert push.pushed == [1, 2, 3]
    assert learner.trained == [{0}, {1}, {2}]  # on-policy: every step trains the version pushed before it
    assert learner.idle == [True, True, True]  # on-policy: no rollout runs while the learner trains
    assert [s for s, _ in logger.steps] == [1, 2, 3]
    assert learner.saves == [True, True, False]  # written beside the next step; the run's last whole on return
    assert metrics["perf/weight_push_bytes"] == 8.0
    assert metrics["system/staleness"] == 0.0


def test_a_resumed_learner_pushes_its_version_before_the_first_job(tmp_path):
    cfg = load_config(None, [f"run.out_dir={tmp_path}", "learner.steps=3", "learner.global_batch_questions=2"])
    push, learner = RecordingPush(), CountingLearner(version=2)
    train_loop(cfg, learner, OneWorker(push), push, QuestionStream(QUESTIONS), RecordingLogger(), progress=False)
    assert push.pushed == [2, 3]
    assert learner.trained == [{2}]


def test_the_learner_is_told_when_no_rollout_runs_during_its_step(tmp_path):
    """With max_staleness 1 the next batch generates during step 1; during the run's last step nothing does (no group
    past the run's end is started), so a learner sharing cores with the rollout workers may use theirs."""
    cfg = load_config(None, [f"run.out_dir={tmp_path}", "learner.steps=2", "learner.global_batch_questions=2",
                             "ray.max_staleness=1"])
    push, learner = RecordingPush(), CountingLearner()
    train_loop(cfg, learner, OneWorker(push), push, QuestionStream(QUESTIONS), RecordingLogger(), progress=False)
    assert learner.idle == [False, True]


def test_a_logger_that_cannot_write_fails_the_run_before_its_first_step(tmp_path):
    """A damaged metrics output fails before a step trains and checkpoints: no step's metrics are lost."""

    class Unwritable(RecordingLogger):
        def open(self, first_step):
            raise IsADirectoryError(f"metrics.jsonl (from step {first_step})")

    cfg = load_config(None, [f"run.out_dir={tmp_path}", "learner.steps=3", "learner.global_batch_questions=2"])
    push, learner = RecordingPush(), CountingLearner()
    with pytest.raises(IsADirectoryError, match="from step 1"):
        train_loop(cfg, learner, OneWorker(push), push, QuestionStream(QUESTIONS), Unwritable(), progress=False)
    assert learner.trained == [] and not hasattr(learner, "saves")  # nothing trained, no checkpoint written
