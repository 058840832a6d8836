"""Single-process ZipRL training (no Ray): the training loop with this process's engine as the rollout source.

    python -m ziprl.train [--config FILE.yaml] [--steps N] [--out runs/train] [--resume | --overwrite]
                          [--sft-checkpoint DIR] [--set section.field=value ...]

For debugging and small runs; ``python -m ziprl.launch`` runs the same loop (``ziprl.learner.loop``) with Ray
rollout actors. Each step writes its trajectories (Parquet), TensorBoard scalars and, every
``run.checkpoint_every`` steps, a checkpoint that ``--resume`` continues from exactly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ziprl.config import ConfigError, ZipRLConfig, check_top_k, load_config
from ziprl.errors import run_command
from ziprl.policy.models import check_model_paths
from ziprl.rundir import prepare_run_dir


def train(cfg: ZipRLConfig, progress: bool = True) -> dict[str, float]:
    """Run ``cfg.learner.steps`` GRPO + HRR steps in this process; returns the last step's metrics."""
    from ziprl.env import SearchCompressEnv
    from ziprl.env.datasets import load_dataset
    from ziprl.env.retriever import Retriever
    from ziprl.eval import retriever_config_for
    from ziprl.learner.loop import LocalLearner, train_loop
    from ziprl.learner.trainer import Trainer
    from ziprl.policy import make_engine, resolve_model_path
    from ziprl.policy.source import InProcessSource
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


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true", help="delete the run already in --out and start afresh")
    ap.add_argument("--sft-checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    flags = {"learner.steps": args.steps, "run.out_dir": args.out, "run.sft_checkpoint": args.sft_checkpoint,
             "run.resume": True if args.resume else None}
    try:
        cfg = load_config(args.config, [f"{k}={v}" for k, v in flags.items() if v is not None] + args.set)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check_model_paths(cfg.model.path, cfg.run.sft_checkpoint)
    prepare_run_dir(cfg.run.out_dir, cfg.run.resume, args.overwrite)
    last = train(cfg)
    print("[train] done:", {k: round(v, 4) for k, v in last.items() if k.startswith(("rollout/reward", "learner/loss"))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
