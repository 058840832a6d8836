"""Single-process training (no Ray): the training loop with this process's engine as the rollout source.

``python -m ziprl.train`` runs :func:`train`; :func:`ziprl.actors.launch.launch` runs the same loop
(:func:`ziprl.learner.loop.train_loop`) with Ray rollout actors. Importing this module loads nothing heavy:
torch, the model and the data load when :func:`train` runs.
"""

from __future__ import annotations

from pathlib import Path

from ziprl.config import ZipRLConfig, check_top_k


def train(cfg: ZipRLConfig, progress: bool = True) -> dict[str, float]:
    """Run ``cfg.learner.steps`` GRPO + HRR steps in this process; returns the last step's metrics."""
    from ziprl.env import SearchCompressEnv
    from ziprl.learner.loop import LocalLearner, train_loop
    from ziprl.learner.trainer import Trainer
    from ziprl.policy import make_engine, resolve_model_path
    from ziprl.policy.source import InProcessSource
    from ziprl.retrieval.datasets import load_dataset, retriever_config_for
    from ziprl.retrieval.retriever import Retriever
    from ziprl.stream import QuestionStream
    from ziprl.tb import MetricsLogger

    model_path = Path(cfg.run.sft_checkpoint) if cfg.run.sft_checkpoint else resolve_model_path(cfg.model)
    examples = load_dataset(cfg.data.dataset, cfg.data.shared_dir, limit=cfg.data.limit, seed=cfg.data.seed)
    retriever = Retriever.from_config(retriever_config_for(cfg))
    check_top_k(cfg.env, len(retriever))
    trainer = Trainer(cfg, model_path)
    engine = make_engine(cfg.model, model_path)
    source = InProcessSource(cfg, engine, lambda: SearchCompressEnv(cfg.env, retriever=retriever, examples=examples),
                             trainer.named_weights_numpy)
    logger = MetricsLogger(cfg.run.out_dir)
    try:
        return train_loop(cfg, LocalLearner(trainer), source, QuestionStream(examples, cfg.data.seed), logger,
                          progress)
    finally:
        logger.close()
        source.close()
