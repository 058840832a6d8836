"""``rollout.overlap``: the in-process source generating the next batch on a thread while the learner trains on this
one. A stand-in engine that sleeps and a learner that sleeps shorter, so the push always comes while a job generates:
the push waits for the job (never overlaps it), every turn carries the weights that generated it, the staleness
stays within ray.max_staleness, an error on the thread reaches the loop, and no thread outlives the source."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ziprl.config import load_config
from ziprl.env.search_env import SearchCompressEnv
from ziprl.loop.in_process import THREAD_NAME, InProcessSource, overlaps
from ziprl.loop.stream import QuestionStream
from ziprl.loop.training import train_loop
from ziprl.policy.engine import Generation, GenerationEngine
from ziprl.retrieval.types import QAExample
from ziprl.testing.loop import RecordingLogger
from ziprl.testing.word_retriever import PASSAGES, WordRetriever
from ziprl.weights.in_process import InProcess

QUESTIONS = [QAExample(id=f"q{i}", question=f"who wrote book {i}?", answers=["Ann"]) for i in range(12)]
GENERATE_S, TRAIN_S = 0.03, 0.01  # a job of 3 turns outlasts a learner step: the push comes while it generates


class TimedEngine(GenerationEngine):
    """Answers each turn after ``GENERATE_S`` with a search naming the weights' version; records when each batch and
    each weight load ran. ``fail_at``: the call (counted from 1) that raises."""

    tokenizer = None

    def __init__(self, fail_at: int = 0):
        self.fail_at, self.version = fail_at, 0
        self.generated: list[tuple[float, float, int]] = []  # (start, end, version) of each generate call
        self.loads: list[tuple[float, float, int]] = []  # (start, end, version) of each load_weights

    def encode_chat(self, messages):
        return [1]

    def generate(self, prompts, sampling, seed=None):
        start, version = time.perf_counter(), self.version
        if len(self.generated) + 1 == self.fail_at:
            raise RuntimeError("the engine broke mid-job")
        time.sleep(GENERATE_S)
        self.generated.append((start, time.perf_counter(), version))
        self.tokens_generated += len(prompts)
        return [Generation(list(p), [1], [0.0], f"<search>weights v{version}</search>", "stop") for p in prompts]

    def load_weights(self, named_arrays, version):
        start = time.perf_counter()
        time.sleep(0.002)
        self.version = version
        self.loads.append((start, time.perf_counter(), version))


class SleepingLearner:
    """Trains in ``TRAIN_S``; records each step's interval, its version and the versions of the groups it trains.
    ``fail_at``: the step (counted from 1) that raises."""

    def __init__(self, version: int = 0, fail_at: int = 0):
        self.version, self.fail_at, self.steps = version, fail_at, []

    def train_step(self, groups, rollouts_idle=None):
        start = time.perf_counter()
        if len(self.steps) + 1 == self.fail_at:
            raise ValueError("the learner broke")
        time.sleep(TRAIN_S)
        self.steps.append((start, time.perf_counter(), self.version, groups))
        self.version += 1
        return {"loss": 0.0}

    def save_checkpoint(self, out_dir: Path, position, background=False):
        return str(out_dir)

    def load_latest(self, out_dir: Path):
        return None


def config(tmp_path, steps=4, staleness=1):
    return load_config(None, [f"run.out_dir={tmp_path}", f"learner.steps={steps}", "learner.global_batch_questions=2",
                              "rollout.group_size=2", "env.max_turns=3", f"ray.max_staleness={staleness}"])


def run(tmp_path, overlap, engine=None, learner=None, steps=4, staleness=1):
    """``steps`` steps of the loop over an in-process source (``overlap``) and push; the engine, learner and logger,
    and the source, closed."""
    cfg, logger = config(tmp_path, steps, staleness), RecordingLogger()
    engine, learner = engine or TimedEngine(), learner or SleepingLearner()
    source = InProcessSource(cfg, engine, lambda: SearchCompressEnv(cfg.env, retriever=WordRetriever(PASSAGES),
                                                                   examples=QUESTIONS), overlap)
    push = InProcess(lambda device, dtype: {}, engine, guard=source.engine_free)
    try:
        train_loop(cfg, learner, source, push, QuestionStream(QUESTIONS), logger, progress=False)
    finally:
        source.close()
    return engine, learner, logger, source


def rollout_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def overlapping(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def finishes(fn, seconds: float = 60.0) -> dict:
    """``fn()``'s value or exception ({"value": ...} or {"error": ...}), failing the test when it runs past ``seconds``
    (a hang)."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: a hang"
    return box


def test_thread_trains_the_same_steps_and_questions_while_the_next_batch_generates_beside_each_step(tmp_path):
    engine, learner, logger, _ = run(tmp_path / "thread", overlap=True)
    off_engine, off_learner, off_logger, _ = run(tmp_path / "off", overlap=False)
    assert [s for s, _ in logger.steps] == [s for s, _ in off_logger.steps] == [1, 2, 3, 4]
    questions = [[g.question_id for g in groups] for *_, groups in learner.steps]
    assert questions == [[g.question_id for g in groups] for *_, groups in off_learner.steps]
    # the batch of step k+1 generated with the weights of step k, beside step k's training
    assert [sorted({g.version for g in groups}) for *_, groups in learner.steps] == [[0], [0], [1], [2]]
    assert [sorted({g.version for g in groups}) for *_, groups in off_learner.steps] == [[0], [1], [2], [3]]
    assert any(overlapping(step[:2], call[:2]) for step in learner.steps for call in engine.generated)
    assert not any(overlapping(step[:2], call[:2]) for step in off_learner.steps for call in off_engine.generated)
    lags = [metrics["system/staleness"] for _, metrics in logger.steps]
    assert lags == [0.0, 1.0, 1.0, 1.0]
    # each step but the last waited for a job (the first for its own, the others in the push, for the next batch's):
    # counted as the step's wait, not as the push's seconds; nothing generates beside the last step
    waits = [metrics["system/wait_seconds"] for _, metrics in logger.steps]
    assert min(waits[:-1]) >= GENERATE_S
    assert waits[-1] < GENERATE_S
    assert waits == [metrics["perf/wait_seconds"] for _, metrics in logger.steps]
    assert max(metrics["perf/weight_push_seconds"] for _, metrics in logger.steps) < GENERATE_S
    assert rollout_threads() == []


def test_the_push_never_runs_while_a_job_generates_and_every_turn_carries_the_weights_that_generated_it(tmp_path):
    engine, learner, _, _ = run(tmp_path, overlap=True, steps=5)
    assert [v for *_, v in engine.loads] == [1, 2, 3, 4, 5]
    assert not [(load, call) for load in engine.loads for call in engine.generated if overlapping(load[:2], call[:2])]
    for *_, version, groups in learner.steps:
        for trajectory in (t for g in groups for t in g):
            written = {turn.response_text for turn in trajectory.turns}
            assert written == {f"<search>weights v{trajectory.policy_version}</search>"}  # no job mixed versions
            assert 0 <= version - trajectory.policy_version <= 1  # ray.max_staleness


def test_an_error_on_the_rollout_thread_is_raised_in_the_loop_and_leaves_no_thread(tmp_path):
    """The 5th turn is the second job's, generating while the learner trains step 1."""
    outcome = finishes(lambda: run(tmp_path, overlap=True, engine=TimedEngine(fail_at=5)))
    assert isinstance(outcome.get("error"), RuntimeError), outcome
    assert str(outcome["error"]) == "the engine broke mid-job"
    assert rollout_threads() == []


def test_a_failing_learner_step_a_resumed_learner_and_a_closed_source_leave_no_thread(tmp_path):
    outcome = finishes(lambda: run(tmp_path / "a", overlap=True, learner=SleepingLearner(fail_at=2)))
    assert isinstance(outcome.get("error"), ValueError), outcome
    assert rollout_threads() == []
    engine, learner, _, _ = run(tmp_path / "b", overlap=True, learner=SleepingLearner(version=2))
    assert [v for *_, v in engine.loads] == [2, 3, 4]  # the resumed version first, before any job
    assert [sorted({g.version for g in groups}) for *_, groups in learner.steps] == [[2], [2]]
    assert rollout_threads() == []

    cfg, engine = config(tmp_path / "c"), TimedEngine()
    source = InProcessSource(cfg, engine, lambda: SearchCompressEnv(cfg.env, retriever=WordRetriever(PASSAGES),
                                                                   examples=QUESTIONS), overlap=True)
    source.submit(0, 0, QUESTIONS[:2], seed=0)
    assert not source.idle_probe()()  # generating
    source.close()  # waits for the job in flight
    assert rollout_threads() == []
    assert len(engine.generated) == 3
    assert source.idle_probe()()
    assert not source.engine_free.locked()


@pytest.mark.parametrize(("setting", "device", "staleness", "threaded"), [
    ("auto", "cuda:0", 1, True), ("auto", "cuda", 2, True),
    ("auto", "cpu", 1, False),  # a CPU: the learner and the rollout would take the same cores
    ("auto", "cuda:0", 0, False),  # on-policy: no job is admitted while the learner trains
    ("thread", "cpu", 1, True), ("off", "cuda:0", 1, False),  # what the user set wins
])
def test_auto_overlaps_on_cuda_with_staleness_and_a_setting_wins(setting, device, staleness, threaded):
    assert overlaps(setting, device, staleness) is threaded


def test_the_in_process_learners_step_and_checkpoint_hold_the_capture_lock(tmp_path, monkeypatch):
    """A CUDA graph capture on the rollout's thread fails when the learner synchronises the device or draws from the
    default generator meanwhile (seen on an H200 with rollout.overlap=thread): the capture takes CAPTURE_LOCK, and so
    do the in-process learner's step and checkpoint, so neither runs inside a capture."""
    import ziprl.learner.checkpoint as checkpoint
    from ziprl.loop.training import LocalLearner
    from ziprl.policy.side_stream import CAPTURE_LOCK

    held = []

    class Trainer:
        policy_version = 0

        def train_step(self, groups):
            held.append(("step", CAPTURE_LOCK.locked()))
            return {"loss": 0.0}

    monkeypatch.setattr(checkpoint, "save_checkpoint",
                        lambda trainer, out, position: held.append(("save", CAPTURE_LOCK.locked())) or out)
    learner = LocalLearner(Trainer())
    learner.train_step([])
    learner.save_checkpoint(tmp_path, {}, background=True)
    assert held == [("step", True), ("save", True)]
    assert not CAPTURE_LOCK.locked()
