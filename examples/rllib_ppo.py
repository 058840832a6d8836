"""Train RLlib PPO (new API stack) on the tokenized SearchCompressEnv.

The policy picks one of ``--num-candidates`` candidate turns (search / open / answer, each with a
compression note) from the token ids of the prompt. Two policy networks:

- ``bag`` (default): token embeddings, mean-pooled over the attention mask, then an MLP (:class:`TokenBagModule`).
- ``mlp``: RLlib's default MLP over the flattened observation (raw ids and mask; a baseline only).

    python examples/rllib_ppo.py --iterations 5
    python examples/rllib_ppo.py --iterations 20 --num-env-runners 2 --tokenizer /models/Qwen3-4B
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import ray
import torch
from ray import tune
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.env_to_module import FlattenObservations
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn

from ziprl.boundary import run_command
from ziprl.cli.common import at_least
from ziprl.integrations.rllib import make_tokenized_env

ENV_NAME = "ziprl-tokenized"


class TokenBagModule(TorchRLModule, ValueFunctionAPI):
    """Masked mean of token embeddings -> MLP -> candidate logits and a value head."""

    def setup(self) -> None:
        dim, hidden = self.model_config.get("embed_dim", 32), self.model_config.get("hidden", 32)
        vocab = int(self.observation_space["tokens"].high.max()) + 1
        self.embed = nn.Embedding(vocab, dim)
        self.trunk = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, self.action_space.n)
        self.vf = nn.Linear(hidden, 1)

    def _features(self, batch: dict[str, Any]) -> torch.Tensor:
        obs = batch[Columns.OBS]
        mask = obs["mask"].float().unsqueeze(-1)
        pooled = (self.embed(obs["tokens"].long()) * mask).sum(-2) / mask.sum(-2).clamp(min=1.0)
        return self.trunk(pooled)

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(self._features(batch))}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        features = self._features(batch)
        return {Columns.ACTION_DIST_INPUTS: self.pi(features), Columns.EMBEDDINGS: features}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        return self.vf(self._features(batch) if embeddings is None else embeddings).squeeze(-1)


def build_config(env_config: dict[str, Any], model: str = "bag", num_env_runners: int = 0,
                 train_batch: int = 64, minibatch: int = 32, epochs: int = 1, lr: float = 3e-4) -> PPOConfig:
    """PPO on the registered ``ziprl-tokenized`` env with a small policy network (``bag`` or ``mlp``)."""
    config = (
        PPOConfig()
        .environment(ENV_NAME, env_config=env_config)
        .training(train_batch_size_per_learner=train_batch, minibatch_size=minibatch, num_epochs=epochs, lr=lr)
    )
    if model == "bag":
        return config.env_runners(num_env_runners=num_env_runners).rl_module(
            rl_module_spec=RLModuleSpec(module_class=TokenBagModule, model_config={"embed_dim": 32, "hidden": 32}))
    if model == "mlp":
        return config.env_runners(
            num_env_runners=num_env_runners, env_to_module_connector=lambda env, spaces, device: FlattenObservations(),
        ).rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32]))
    raise ValueError(f"model must be 'bag' or 'mlp', got {model!r}")


@run_command
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=at_least(1), default=5)
    p.add_argument("--model", choices=["bag", "mlp"], default="bag")
    p.add_argument("--num-env-runners", type=at_least(0), default=0)
    p.add_argument("--num-cpus", type=at_least(1), default=None, help="CPUs of the local Ray cluster (default: all)")
    p.add_argument("--train-batch", type=at_least(1), default=64)
    p.add_argument("--max-len", type=at_least(1), default=512)
    p.add_argument("--num-candidates", type=at_least(1), default=8)
    p.add_argument("--max-turns", type=at_least(1), default=6)
    p.add_argument("--tokenizer", default=None, help="local HF tokenizer directory (default: the embedded policy's)")
    args = p.parse_args(argv)

    ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    tune.register_env(ENV_NAME, make_tokenized_env)
    env_config = {"max_len": args.max_len, "num_candidates": args.num_candidates,
                  "env": {"max_turns": args.max_turns}, "tokenizer": args.tokenizer}
    algo = build_config(env_config, args.model, args.num_env_runners, args.train_batch,
                        minibatch=max(1, args.train_batch // 2)).build_algo()
    try:
        for i in range(1, args.iterations + 1):
            r = algo.train()
            runners, learner = r["env_runners"], r["learners"]["default_policy"]
            ret = runners.get("episode_return_mean", math.nan)
            print(f"iter {i}: return_mean={ret:.3f} episodes={runners.get('num_episodes', 0)} "
                  f"env_steps={runners['num_env_steps_sampled_lifetime']:.0f} loss={learner['total_loss']:.4f}",
                  flush=True)
    finally:
        algo.stop()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
