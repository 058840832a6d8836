"""One GRPO + HRR step in one process, top to bottom: rollout -> advantages -> loss -> optimizer step -> weight push.

    python examples/one_step.py [--model DIR] [--questions 2] [--group-size 2] [--seed 0]

A single-file reference for what every step of ``python -m ziprl.train`` does, with the library's own pieces and
nothing hidden. The update (advantages -> loss -> backward -> optimizer step) is the one function the trainer runs,
``ziprl.learner.step.update_step``; here it trains the policy in plain torch (:class:`TorchPolicy`), where the trainer
runs it through DeepSpeed, data-parallel ranks and checkpoints (``ziprl/learner/trainer.py``), and the loop around
it admits groups by staleness (``ziprl/loop/training.py``).

By default the policy is a tiny random Llama (2 layers, hidden 64) with the embedded SmolLM2 tokenizer, and the
questions and the corpus are the shipped sample (``ziprl/data/sample`` and its prebuilt FAISS index), so it runs on
a laptop CPU in seconds. A random model writes noise: its turns are malformed and its rewards 0, so its step has no
signal (every advantage is 0) and only shows the plumbing; ``--model DIR`` (a Stage 1 checkpoint, say) shows real
advantages and a real update.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from ziprl.boundary import run_command
from ziprl.cli.common import at_least  # noqa: E402
from ziprl.config import ModelConfig, RetrieverConfig, ZipRLConfig, load_config  # noqa: E402
from ziprl.env import SearchCompressEnv  # noqa: E402
from ziprl.learner.batch import MicroBatch, TurnRow, make_micro_batches  # noqa: E402
from ziprl.learner.step import update_step  # noqa: E402
from ziprl.learner.step_stats import StepStats  # noqa: E402
from ziprl.learner.trainer import tis_cap  # noqa: E402
from ziprl.policy import make_engine  # noqa: E402
from ziprl.policy.models import (  # noqa: E402
    build_tiny_llama,
    load_model,
    resolve_model_path,
    torch_dtype,
    validate_model_dir,
)
from ziprl.policy.rollout import rollout_groups  # noqa: E402
from ziprl.retrieval.datasets import load_dataset  # noqa: E402
from ziprl.retrieval.retriever import Retriever  # noqa: E402
from ziprl.weights.in_process import InProcess  # noqa: E402


class TorchPolicy:
    """The policy, its frozen reference and AdamW in plain torch, float32, one process: what ``update_step`` trains
    (a ``ziprl.learner.step.Trainable``, as the DeepSpeed ``Trainer`` is)."""

    zero_stage = 0  # no DeepSpeed
    device = torch.device("cpu")

    def __init__(self, cfg: ZipRLConfig, model_dir: Path, pad_id: int) -> None:
        self.cfg, self.pad_id = cfg, pad_id
        self.policy = load_model(model_dir).train()
        # the frozen start, for the KL term; until the first update the policy's own log-probs are its
        self.reference = load_model(model_dir).requires_grad_(False) if cfg.learner.beta > 0 else None
        self.at_reference = True
        # an HF float32 engine and a float32 learner: the behaviour log-probs are the learner's, no rollout correction
        self.tis_cap = tis_cap(cfg, bf16=False)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=cfg.learner.lr,
                                           weight_decay=cfg.learner.weight_decay)
        self.policy_version = 0

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def compute(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # float32: no autocast

    def micro_batches(self, rows: list[TurnRow]) -> tuple[list[tuple[MicroBatch, bool]], None]:
        """``learner.micro_batch_turns`` rows a micro-batch, the prompt tokens its rows share run once; no prefix shared
        by the whole step."""
        batches = make_micro_batches(rows, self.cfg.learner.micro_batch_turns, self.pad_id, share_prefix=True)
        return [(mb, True) for mb in batches], None

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # gradients accumulate over the micro-batches: each loss holds the whole batch's weights

    def optimizer_step(self) -> float:
        """Clip the gradient's global norm, one AdamW update; the policy's next version."""
        max_norm = self.cfg.learner.max_grad_norm if self.cfg.learner.max_grad_norm > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.policy_version += 1
        self.at_reference = False
        return norm


def one_step(model_dir: Path, questions: int = 2, group_size: int = 2, seed: int = 0) -> dict[str, float]:
    """One step from ``model_dir``'s weights; returns what each stage produced."""
    cfg = load_config(None, [f"rollout.group_size={group_size}", "env.max_turns=2", "sampling.max_new_tokens=32",
                             "learner.lr=1e-4", "model.device=cpu"])
    torch.manual_seed(seed)

    # 1. Rollout: G episodes per question through the env, one generation batch per turn; every turn keeps its
    #    prompt and response token ids, the engine's (behaviour) log-probs and its Q_com.
    examples = load_dataset("sample", limit=questions, seed=seed)
    retriever = Retriever.from_config(RetrieverConfig())  # the shipped sample's prebuilt index
    engine = make_engine(cfg.model, model_dir)
    groups = rollout_groups(engine, lambda: SearchCompressEnv(cfg.env, retriever=retriever, examples=examples),
                            examples, cfg, seed)

    # 2-4. The update, ziprl.learner.step.update_step:
    #    advantages: GRPO per trajectory, A_i = (R_i - mean_group) / (std_group + eps), then HRR per turn,
    #      A_ij = A_i + w (Q_ij - Q_bar_i) (ziprl/learner/advantages/: learner.advantage_estimator, learner.hrr_weight);
    #    loss: one training row per turn (its response tokens weighted 1 / (G |o_i|), learner.loss_norm), in
    #      micro-batches; the ZipRL objective, -sum_t w_t (min(rho A, clip(rho) A) - beta KL_t) (learner.policy_loss),
    #      each micro-batch's backward accumulating the gradient;
    #    optimizer step: TorchPolicy.optimizer_step; the policy is now version 1.
    #    What it measured (losses, KL, clipping, timing, the update probe) lands in the StepStats beside it.
    learner = TorchPolicy(cfg, model_dir, engine.tokenizer.pad_token_id)
    stats = StepStats(time.perf_counter)
    update_step(learner, groups, stats)
    learned = stats.metrics()

    # 5. Weight push: the new weights into the engine that generates the next step's rollouts, copied where and in
    #    the dtype the engine takes them (its weights_device / weights_dtype).
    def weights(device: str, dtype: str) -> dict[str, torch.Tensor]:
        return {name: p.detach().to(device, torch_dtype(dtype), copy=True)
                for name, p in learner.policy.named_parameters()}

    pushed = InProcess(weights, engine).push(version=learner.policy_version)

    rewards = [t.reward for group in groups for t in group]
    return {"trajectories": float(len(rewards)), "turns": learned["turns"], "reward": sum(rewards) / len(rewards),
            **{k: learned[k] for k in ("adv_std", "hrr_abs_mean", "loss", "kl", "grad_norm", "policy_version")},
            "pushed_bytes": pushed["bytes"], "engine_version": float(engine.version)}


@run_command
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="an HF checkpoint directory (default: a tiny random Llama)")
    ap.add_argument("--questions", type=at_least(1), default=2)
    ap.add_argument("--group-size", type=at_least(2), default=2, help="episodes per question (a GRPO group)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.model is not None:
        validate_model_dir(args.model.expanduser())  # ModelPathError (exit 2) before anything loads
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_tiny_llama(resolve_model_path(ModelConfig()), Path(tmp) / "tiny-llama")
        out = one_step(model, args.questions, args.group_size, args.seed)
    for key, value in out.items():
        print(f"{key:>16}: {value:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
