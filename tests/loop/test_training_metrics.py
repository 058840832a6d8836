"""The training loop logs a step's metrics row before writing its checkpoint, so a process killed between the two
never leaves a checkpoint of a step whose row is missing (a resume starts logging after the checkpoint's step);
``perf/save_seconds`` is the checkpoint written after the previous step, ``perf/trajectories_seconds`` the step's
trajectory files."""

from __future__ import annotations

import time

from ziprl.config import load_config
from ziprl.loop.stream import QuestionStream
from ziprl.loop.training import train_loop
from ziprl.retrieval.types import QAExample
from ziprl.testing.loop import CountingLearner, OneWorker, RecordingLogger, RecordingPush

QUESTIONS = [QAExample(id=f"q{i}", question=f"question {i}?", answers=[str(i)]) for i in range(6)]
SAVE_S = 0.2


class SlowCheckpoints(CountingLearner):
    """Records, at each checkpoint, the steps the logger holds; each write takes ``SAVE_S``."""

    def __init__(self, logger):
        super().__init__()
        self.logger, self.logged_at_save = logger, []

    def save_checkpoint(self, out_dir, position, background=False):
        self.logged_at_save.append([s for s, _ in self.logger.steps])
        time.sleep(SAVE_S)
        return super().save_checkpoint(out_dir, position, background)


def test_each_step_is_logged_before_its_checkpoint_is_written(tmp_path, monkeypatch):
    from ziprl.loop import training

    monkeypatch.setattr(training, "save_groups", lambda groups, path: time.sleep(SAVE_S / 2))
    cfg = load_config(None, [f"run.out_dir={tmp_path}", "learner.steps=3", "learner.global_batch_questions=2",
                             "ray.max_staleness=0", "run.checkpoint_every=1"])
    push, logger = RecordingPush(), RecordingLogger()
    learner = SlowCheckpoints(logger)
    train_loop(cfg, learner, OneWorker(push), push, QuestionStream(QUESTIONS), logger, progress=False)
    assert learner.logged_at_save == [[1], [1, 2], [1, 2, 3]]
    saves = [m["perf/save_seconds"] for _, m in logger.steps]
    assert saves[0] == 0.0 and all(s >= SAVE_S for s in saves[1:])  # the previous step's write
    assert all(m["perf/step_seconds"] >= SAVE_S for _, m in logger.steps[1:])  # from one row to the next
    assert all(SAVE_S / 2 <= m["perf/trajectories_seconds"] < SAVE_S for _, m in logger.steps)  # its own files
