"""Train a policy with TRL's GRPOTrainer on SearchCompressEnv (the shipped sample questions and index).

TRL drives the training; ZipRL's env plays each episode inside TRL's ``rollout_func`` and its reward is
the GRPO reward (optionally plus the episode's mean Q_com, ``--q-com-weight``). Trajectories are written
under ``--out`` so ``python -m ziprl.view --out report.html <out>`` shows what the agent did.

    python examples/trl_grpo.py --steps 3                      # the embedded SmolLM2-135M-Instruct, on CPU
    python examples/trl_grpo.py --steps 50 --model /models/Qwen3-4B --generations 8
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from ziprl.boundary import run_command
from ziprl.cli.common import at_least  # noqa: E402
from ziprl.config import ModelConfig, RetrieverConfig, SamplingConfig  # noqa: E402
from ziprl.outputs import work_dir  # noqa: E402
from ziprl.policy.models import check_model_paths, load_tokenizer, resolve_model_path  # noqa: E402
from ziprl.registry import STRATEGIES  # noqa: E402
from ziprl.retrieval.datasets import load_dataset  # noqa: E402

KIND = "example-trl_grpo"  # the marker kind of --out: no ZipRL command writes into it, nor this example into theirs


@run_command
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=at_least(1), default=3)
    p.add_argument("--model", default=None, help="local HF model directory (default: the embedded SmolLM2-135M)")
    p.add_argument("--questions", type=at_least(1), default=8, help="sample questions to train on")
    p.add_argument("--generations", type=at_least(2), default=4, help="episodes per question (the GRPO group)")
    p.add_argument("--max-turns", type=at_least(1), default=4)
    p.add_argument("--max-new-tokens", type=at_least(1), default=96)
    p.add_argument("--strategy", default="adaptive", choices=STRATEGIES.names())
    p.add_argument("--q-com-weight", type=float, default=0.0, help="weight of the mean-Q_com reward term")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--out", default="runs/trl_grpo", help="new or empty directory, or one this example wrote")
    args = p.parse_args(argv)

    # Every input is checked before anything is written or loaded.
    check_model_paths(args.model)
    examples = load_dataset("sample", limit=args.questions)
    out = work_dir(args.out, KIND)  # new, empty or this example's: checked, then created and marked

    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from ziprl.env.search_env import SearchCompressEnv
    from ziprl.integrations.trl import SearchCompressRollout, env_reward, prompt_dataset, q_com_reward
    from ziprl.retrieval.retriever import Retriever

    model_dir = resolve_model_path(ModelConfig(path=args.model))
    retriever = Retriever.from_config(RetrieverConfig())
    rollout = SearchCompressRollout(
        lambda: SearchCompressEnv({"strategy": args.strategy, "max_turns": args.max_turns}, retriever=retriever),
        examples, SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens), save_dir=out)
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.generations,
        num_generations=args.generations, learning_rate=args.lr, temperature=1.0, beta=0.0,
        max_completion_length=args.max_turns * (args.max_new_tokens + 512), logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=not _cuda(), bf16=_cuda(),  # bf16 autocast is slow on CPUs
        reward_weights=[1.0, args.q_com_weight],
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir), processing_class=load_tokenizer(model_dir),
        reward_funcs=[env_reward, q_com_reward], args=config, train_dataset=prompt_dataset(examples),
        rollout_func=rollout,
    )
    trainer.train()
    print(f"env steps: {rollout.env_steps}; trajectories: {out}/trajectories (view: python -m ziprl.view {out})")
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
