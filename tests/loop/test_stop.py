"""SIGINT and SIGTERM stop the training loop where its checkpoint is exact (ziprl.loop.stop): at once while it waits
for rollouts, else at the end of the step; a second signal at once without that checkpoint; an ignored signal stays
ignored. The real command end to end: tests/loop/test_in_process.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from ziprl.config import load_config
from ziprl.loop.stop import Stop, StopSignals
from ziprl.loop.stream import QuestionStream
from ziprl.loop.training import train_loop
from ziprl.retrieval.types import QAExample
from ziprl.testing.loop import CountingLearner, OneWorker, RecordingLogger, RecordingPush

QUESTIONS = [QAExample(id=f"q{i}", question=f"question {i}?", answers=[str(i)]) for i in range(8)]


@pytest.fixture(autouse=True)
def default_handlers():
    """Each test starts from Python's own handlers, with both signals deliverable, not from what the test process
    inherited or an earlier test left: a runner started in the background ignores SIGINT (and the loop rightly keeps
    an ignored signal ignored), and a library may have blocked it."""
    both = {signal.SIGINT, signal.SIGTERM}
    old = {s: signal.getsignal(s) for s in both}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in old.items():
        signal.signal(s, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class CheckpointingLearner(CountingLearner):
    """Trains (counting), sends itself ``signals`` in the middle of step ``at_step``'s update, and keeps its
    checkpoints (version, position) to resume from."""

    def __init__(self, at_step=0, signals=(), version=0, position=None):
        super().__init__(version)
        self.at_step, self.signals, self.saved, self.questions = at_step, signals, [], []
        self.position = position

    def train_step(self, groups, rollouts_idle=None):
        if self.version + 1 == self.at_step:
            for s in self.signals:
                os.kill(os.getpid(), s)
                time.sleep(0.01)  # the handler runs here, half way through the update
        self.questions.append(sorted(g.question_id for g in groups))
        return super().train_step(groups, rollouts_idle)

    def save_checkpoint(self, out_dir, position, background=False):
        self.saved.append((self.version, position))
        return f"step_{self.version}"

    def load_latest(self, out_dir):
        return self.position


class SignalInWait(OneWorker):
    """Sends itself ``signum`` while waiting for the batch of step ``at_step``, then waits long."""

    def __init__(self, push, signum, at_step):
        super().__init__(push)
        self.signum, self.at_step = signum, at_step

    def wait(self):
        if self.push.version + 1 == self.at_step:
            os.kill(os.getpid(), self.signum)
            time.sleep(30)  # the stop breaks into this wait
        return super().wait()


def config(tmp_path, steps=3, resume=False, every=100):
    return load_config(None, [f"run.out_dir={tmp_path}", f"learner.steps={steps}", "learner.global_batch_questions=2",
                              "ray.max_staleness=0", f"run.checkpoint_every={every}", f"run.resume={resume}"])


def run(tmp_path, learner, source=None, push=None, **kw):
    push = push or RecordingPush()
    logger = RecordingLogger()
    try:
        train_loop(config(tmp_path, **kw), learner, source or OneWorker(push), push, QuestionStream(QUESTIONS),
                   logger, progress=False)
    finally:
        learner.logged = [s for s, _ in logger.steps]


def straight(tmp_path):
    """The questions of each step of a run that nothing stops."""
    learner = CheckpointingLearner()
    run(tmp_path / "straight", learner)
    return learner.questions


def resumed(tmp_path, learner):
    """The questions of each step of the run resumed from ``learner``'s last checkpoint."""
    version, position = learner.saved[-1]
    again = CheckpointingLearner(version=version, position=position)
    run(tmp_path, again, resume=True)
    assert again.logged == list(range(version + 1, 4))
    return again.questions


def test_a_sigterm_during_the_update_stops_after_the_step_with_its_checkpoint(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    learner = CheckpointingLearner(at_step=2, signals=[signal.SIGTERM])
    with pytest.raises(Stop) as stopped:
        run(tmp_path, learner)
    assert stopped.value.exit_code == 143 and stopped.value.checkpoint
    assert learner.version == 2 and learner.logged == [1, 2]  # step 2's update went through whole
    assert [v for v, _ in learner.saved] == [2]  # and the checkpoint holds it
    err = capsys.readouterr()
    assert "SIGTERM: stopping at the end of this step" in err.err
    assert "stopped at step 2: checkpoint step_2" in err.out
    assert signal.getsignal(signal.SIGTERM) is before
    assert learner.questions + resumed(tmp_path, learner) == straight(tmp_path)  # no question lost or repeated


def test_a_sigint_while_waiting_for_rollouts_stops_at_once_and_the_resumed_run_redoes_the_job(tmp_path):
    push = RecordingPush()
    learner = CheckpointingLearner()
    t0 = time.perf_counter()
    with pytest.raises(Stop) as stopped:
        run(tmp_path, learner, SignalInWait(push, signal.SIGINT, at_step=2), push)
    assert time.perf_counter() - t0 < 10  # not the 30 s wait
    assert stopped.value.exit_code == 130
    assert learner.logged == [1] and [v for v, _ in learner.saved] == [1]
    (_, position), = learner.saved
    expected = straight(tmp_path)
    assert [sorted(position["pending"][0]["ids"])] == expected[1:2]  # the job in flight, re-run first on resume
    assert learner.questions + resumed(tmp_path, learner) == expected


def test_a_stop_after_a_checkpointed_step_does_not_write_that_step_again(tmp_path, capsys):
    """With a checkpoint every step, a SIGTERM while waiting for step 2's rollouts ends the run on step 1's
    checkpoint (waiting for its write), not a second checkpoint of step 1; the resumed run loses and repeats
    nothing."""
    push = RecordingPush()
    learner = CheckpointingLearner()
    with pytest.raises(Stop) as stopped:
        run(tmp_path, learner, SignalInWait(push, signal.SIGTERM, at_step=2), push, every=1)
    assert stopped.value.exit_code == 143 and stopped.value.checkpoint
    assert [v for v, _ in learner.saved] == [1] and learner.finished == 1
    assert "stopped at step 1: checkpoint step_1" in capsys.readouterr().out
    assert learner.questions + resumed(tmp_path, learner) == straight(tmp_path)


def test_a_second_signal_stops_at_once_without_the_checkpoint(tmp_path, capsys):
    learner = CheckpointingLearner(at_step=2, signals=[signal.SIGTERM, signal.SIGINT])
    with pytest.raises(Stop) as stopped:
        run(tmp_path, learner)
    assert not stopped.value.checkpoint and stopped.value.exit_code == 130
    assert learner.version == 1 and learner.saved == []  # the last whole checkpoint stays the run's last
    assert "stopped without a checkpoint of this step" in capsys.readouterr().out


def test_a_signal_ignored_at_the_start_stays_ignored(tmp_path):
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        learner = CheckpointingLearner(at_step=2, signals=[signal.SIGINT])
        try:
            run(tmp_path, learner)
        except Stop:  # caught here: as a KeyboardInterrupt it would end the whole test session
            pytest.fail("a SIGINT ignored when the run started stopped it")
        assert learner.logged == [1, 2, 3]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_outside_the_main_thread_no_handler_is_installed():
    import threading

    seen = []
    thread = threading.Thread(target=lambda: seen.append(StopSignals().__enter__()._saved))
    before = signal.getsignal(signal.SIGTERM)
    thread.start()
    thread.join()
    assert seen == [{}] and signal.getsignal(signal.SIGTERM) is before
