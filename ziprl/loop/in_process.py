"""Single-process training (no Ray): this process's engine as the rollout source, its weights loaded in place.

``python -m ziprl.train`` runs :func:`train`; :func:`ziprl.actors.launch.launch` runs the same loop
(:func:`ziprl.loop.training.train_loop`) with Ray rollout actors. Importing this module loads nothing heavy:
torch, the model and the data load when :func:`train` runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path

from ziprl.config import ZipRLConfig, check_top_k, resolve_engine_dtype
from ziprl.env.search_env import SearchCompressEnv
from ziprl.loop.source import Completion, job_stats
from ziprl.policy.engine import GenerationEngine
from ziprl.policy.rollout import rollout_groups
from ziprl.retrieval.types import QAExample


class InProcessSource:
    """One worker, this process: a job runs when the loop waits for it, with the engine's weights at that time.

    All questions of a learner step go in one job (``learner.global_batch_questions``), so their episodes are
    generated as one batch.
    """

    num_workers = 1

    def __init__(self, cfg: ZipRLConfig, engine: GenerationEngine, make_env: Callable[[], SearchCompressEnv]):
        self.cfg, self.engine, self.make_env = cfg, engine, make_env
        self.questions_per_call = cfg.learner.global_batch_questions
        self._jobs: deque[tuple[int, list[QAExample], int]] = deque()

    def submit(self, worker: int, ticket: int, examples: list[QAExample], seed: int) -> None:
        self._jobs.append((ticket, examples, seed))

    def wait(self) -> list[Completion]:
        ticket, examples, seed = self._jobs.popleft()
        tokens, secs = self.engine.tokens_generated, self.engine.generation_seconds
        groups = rollout_groups(self.engine, self.make_env, examples, self.cfg, seed)
        return [Completion(ticket, groups, job_stats(self.engine, tokens, secs))]

    def idle_probe(self) -> Callable[[], bool]:
        return nothing_runs  # a job runs inside wait(), never beside a learner step

    def close(self) -> None:
        self._jobs.clear()


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
    source = InProcessSource(cfg, engine, lambda: SearchCompressEnv(cfg.env, retriever=retriever, examples=examples))
    push = InProcess(trainer.named_weights, engine)
    logger = MetricsLogger(cfg.run.out_dir)
    try:
        return train_loop(cfg, LocalLearner(trainer), source, push, QuestionStream(examples, cfg.data.seed), logger,
                          progress)
    finally:
        logger.close()
        push.close()
        source.close()
