"""Single-process training (no Ray): this process's engine as the rollout source, its weights loaded in place.

``python -m ziprl.train`` runs :func:`train`; :func:`ziprl.actors.launch.launch` runs the same loop
(:func:`ziprl.loop.training.train_loop`) with Ray rollout actors. Importing this module loads nothing heavy:
torch, the model and the data load when :func:`train` runs. ``rollout.overlap`` (:func:`overlaps`) decides whether
a job generates inside the loop's wait or on a thread beside the learner's step.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ziprl.config import ZipRLConfig, check_top_k, resolve_engine_dtype
from ziprl.env.search_env import SearchCompressEnv
from ziprl.loop.source import Completion, job_stats
from ziprl.policy.engine import GenerationEngine
from ziprl.policy.rollout import rollout_groups
from ziprl.policy.side_stream import side_stream
from ziprl.retrieval.types import QAExample

THREAD_NAME = "ziprl-rollout"  # the thread a job generates on beside the learner (rollout.overlap)


def overlaps(setting: str, engine_device: str, max_staleness: int) -> bool:
    """Whether ``rollout.overlap=setting`` generates each job on a thread beside the learner's step, the engine on
    ``engine_device``: thread yes, off no, auto with the engine on CUDA and ``max_staleness`` >= 1 (on a CPU the two
    would take the same cores; at 0 no job is admitted while the learner trains)."""
    if setting != "auto":
        return setting == "thread"
    return engine_device.startswith("cuda") and max_staleness >= 1


class InProcessSource:
    """One worker, this process's engine. All questions of a learner step go in one job
    (``learner.global_batch_questions``), so their episodes are generated as one batch.

    Without ``overlap`` a job runs when the loop waits for it, with the engine's weights at that time, never beside a
    learner step. With ``overlap`` it starts on a thread (:data:`THREAD_NAME`) when it is submitted, on CUDA on a
    stream of its own (:func:`~ziprl.policy.side_stream.side_stream`), and generates beside the learner's step with
    the weights of its submission: :attr:`engine_free` is held from its submission to its end, and the in-place push
    holds it too (:class:`~ziprl.weights.in_process.InProcess`'s ``guard``), so a push waits for the job in flight and
    a job's groups carry the version that generated them. What the job raises, :meth:`wait` raises.
    """

    num_workers = 1

    def __init__(self, cfg: ZipRLConfig, engine: GenerationEngine, make_env: Callable[[], SearchCompressEnv],
                 overlap: bool = False):
        self.cfg, self.engine, self.make_env, self.overlap = cfg, engine, make_env, overlap
        self.questions_per_call = cfg.learner.global_batch_questions
        self.engine_free = threading.Lock()
        self._jobs: deque[tuple[int, list[QAExample], int]] = deque()  # submitted, run by wait() (no overlap)
        self._thread: threading.Thread | None = None
        self._outcome: Completion | BaseException | None = None  # the thread's job, as wait() returns or raises it
        self._stream = side_stream(engine.weights_device) if overlap else None

    def submit(self, worker: int, ticket: int, examples: list[QAExample], seed: int) -> None:
        if not self.overlap:
            self._jobs.append((ticket, examples, seed))
            return
        self.engine_free.acquire()  # free: the job before was waited for; the thread releases it when the job ends
        try:
            self._thread = threading.Thread(target=self._run_beside, args=(ticket, examples, seed), name=THREAD_NAME,
                                            daemon=True)
            self._thread.start()
        except BaseException:
            self._thread = None
            self.engine_free.release()
            raise

    def wait(self) -> list[Completion]:
        if not self.overlap:
            return [self._run(*self._jobs.popleft())]
        self._thread.join()
        self._thread, outcome, self._outcome = None, self._outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        return [outcome]

    def idle_probe(self) -> Callable[[], bool]:
        # with overlap a bound method (this process's learner polls it; it is not picklable)
        return self._nothing_generates if self.overlap else nothing_runs

    def close(self) -> None:
        """Wait for a job still generating (what it returns or raises is dropped); forget the ones not started."""
        if self._thread is not None:
            self._thread.join()
            self._thread = self._outcome = None
        self._jobs.clear()

    def _run(self, ticket: int, examples: list[QAExample], seed: int) -> Completion:
        tokens, secs = self.engine.tokens_generated, self.engine.generation_seconds
        groups = rollout_groups(self.engine, self.make_env, examples, self.cfg, seed)
        return Completion(ticket, groups, job_stats(self.engine, tokens, secs))

    def _run_beside(self, ticket: int, examples: list[QAExample], seed: int) -> None:
        try:
            with self._stream():
                self._outcome = self._run(ticket, examples, seed)
        except BaseException as exc:  # handed to the loop's thread: wait() raises it
            self._outcome = exc
        finally:
            self.engine_free.release()

    def _nothing_generates(self) -> bool:
        return not self.engine_free.locked()


def nothing_runs() -> bool:
    """The idle probe of a source whose jobs never run beside a learner step."""
    return True


def train(cfg: ZipRLConfig, progress: bool = True) -> dict[str, float]:
    """Run ``cfg.learner.steps`` GRPO + HRR steps in this process; returns the last step's metrics."""
    from ziprl.learner.checkpoint import resumed_learner
    from ziprl.learner.trainer import Trainer
    from ziprl.loop.stream import QuestionStream
    from ziprl.loop.training import LocalLearner, train_loop
    from ziprl.policy import make_engine, resolve_model_path
    from ziprl.retrieval.datasets import load_questions, retriever_config_for
    from ziprl.retrieval.retriever import Retriever
    from ziprl.tb import MetricsLogger
    from ziprl.weights.in_process import InProcess

    cfg = resumed_learner(cfg)  # a resumed run computes in the dtype it was written in
    model_path = Path(cfg.run.sft_checkpoint) if cfg.run.sft_checkpoint else resolve_model_path(cfg.model)
    examples = load_questions(cfg.data)
    retriever = Retriever.from_config(retriever_config_for(cfg))
    check_top_k(cfg.env, len(retriever))
    trainer = Trainer(cfg, model_path)
    engine = make_engine(resolve_engine_dtype(cfg.model, trainer.bf16), model_path)
    overlap = overlaps(cfg.rollout.overlap, engine.weights_device, cfg.ray.max_staleness)
    if cfg.rollout.overlap == "auto":
        print(f"[train] rollout.overlap=auto: {'thread' if overlap else 'off'} (engine on {engine.weights_device}, "
              f"ray.max_staleness={cfg.ray.max_staleness})", flush=True)
    source = InProcessSource(cfg, engine, lambda: SearchCompressEnv(cfg.env, retriever=retriever, examples=examples),
                             overlap)
    push = InProcess(trainer.named_weights, engine, guard=source.engine_free)
    logger = MetricsLogger(cfg.run.out_dir)
    try:
        return train_loop(cfg, LocalLearner(trainer), source, push, QuestionStream(examples, cfg.data.seed), logger,
                          progress)
    finally:
        logger.close()
        push.close()
        source.close()
