"""Single-process ZipRL training (no Ray): roll out, GRPO + HRR advantages, update, reload weights, repeat.

    python -m ziprl.train [--config FILE.yaml] [--steps N] [--out runs/train] [--resume | --overwrite]
                          [--sft-checkpoint DIR] [--set section.field=value ...]

For debugging and small runs; ``python -m ziprl.launch`` runs the same algorithm on Ray.
Each step writes its trajectories (Parquet), TensorBoard scalars and, every ``run.checkpoint_every`` steps,
a checkpoint that ``--resume`` continues from exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from ziprl.config import ConfigError, ZipRLConfig, check_top_k, load_config
from ziprl.env.stats import trajectory_stats
from ziprl.env.trajectory import save_trajectories
from ziprl.errors import run_command
from ziprl.policy.models import check_model_paths
from ziprl.rundir import prepare_run_dir


def context_limit(engine, max_new_tokens: int) -> int | None:
    """Longest prompt the engine's model can take while leaving room for ``max_new_tokens``."""
    n = getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)
    return n - max_new_tokens if n else None


def train(cfg: ZipRLConfig, progress: bool = True) -> dict[str, float]:
    """Run ``cfg.learner.steps`` GRPO + HRR steps; returns the last step's metrics."""
    from ziprl.env import SearchCompressEnv
    from ziprl.env.datasets import load_dataset
    from ziprl.env.retriever import Retriever
    from ziprl.eval import retriever_config_for
    from ziprl.learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from ziprl.learner.trainer import Trainer
    from ziprl.policy import make_engine, resolve_model_path
    from ziprl.policy.rollout import rollout
    from ziprl.stream import QuestionStream
    from ziprl.tb import MetricsLogger

    out = Path(cfg.run.out_dir)
    model_path = Path(cfg.run.sft_checkpoint) if cfg.run.sft_checkpoint else resolve_model_path(cfg.model)
    examples = load_dataset(cfg.data.dataset, cfg.data.shared_dir, limit=cfg.data.limit, seed=cfg.data.seed)
    stream = QuestionStream(examples, cfg.data.seed)
    retriever = Retriever.from_config(retriever_config_for(cfg))
    check_top_k(cfg.env, len(retriever))
    trainer = Trainer(cfg, model_path)
    if cfg.run.resume and (ckpt := latest_checkpoint(out)) is not None:
        stream.restore(load_checkpoint(trainer, ckpt))
        print(f"[train] resumed from {ckpt} at step {trainer.global_step}", flush=True)
    engine = make_engine(cfg.model, model_path)
    if trainer.policy_version:
        engine.load_weights(trainer.named_weights_numpy(), trainer.policy_version)
    logger = MetricsLogger(out)
    make_env = lambda: SearchCompressEnv(cfg.env, retriever=retriever, examples=examples)  # noqa: E731
    limit = context_limit(engine, cfg.sampling.max_new_tokens)
    metrics: dict[str, float] = {}
    bar = tqdm(total=cfg.learner.steps, initial=trainer.global_step, desc="train", unit="step", disable=not progress)
    while trainer.global_step < cfg.learner.steps:
        step = trainer.global_step + 1
        t0 = time.perf_counter()
        batch = stream.next_batch(cfg.learner.global_batch_questions)
        gen_tokens, gen_secs = engine.tokens_generated, engine.generation_seconds
        trajs = rollout(engine, make_env, batch, cfg.sampling, group_size=cfg.rollout.group_size,
                        seed=cfg.learner.seed * 1_000_003 + step, max_prompt_tokens=limit)
        t_rollout = time.perf_counter() - t0
        save_trajectories(trajs, out / "trajectories" / f"step_{step:06d}.parquet")
        learn = trainer.train_step(trajs)
        t1 = time.perf_counter()
        engine.load_weights(trainer.named_weights_numpy(), trainer.policy_version)
        push = time.perf_counter() - t1
        metrics = {**{f"rollout/{k}": v for k, v in trajectory_stats(trajs).items()},
                   **{f"learner/{k}": v for k, v in learn.items()},
                   "perf/rollout_seconds": t_rollout, "perf/weight_push_seconds": push,
                   "perf/step_seconds": time.perf_counter() - t0,
                   "perf/gen_tokens_per_second": (engine.tokens_generated - gen_tokens)
                   / max(engine.generation_seconds - gen_secs, 1e-9)}
        logger.log(step, metrics)
        if step % cfg.run.checkpoint_every == 0 or step == cfg.learner.steps:
            save_checkpoint(trainer, out, stream.position)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['rollout/reward']:.2f}", q_com=f"{metrics['rollout/q_com']:.2f}",
                        loss=f"{learn.get('loss', float('nan')):.4f}")
    bar.close()
    logger.close()
    return metrics


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


