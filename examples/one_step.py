"""One GRPO + HRR step in one process, top to bottom: rollout -> advantages -> loss -> optimizer step -> weight push.

    python examples/one_step.py [--model DIR] [--questions 2] [--group-size 2] [--seed 0]

A single-file reference for what every step of ``python -m ziprl.train`` does, with the library's own pieces and
nothing hidden. The trainer runs the same math through DeepSpeed, micro-batching and checkpoints
(``ziprl/learner/trainer.py``), and the loop around it admits groups by staleness (``ziprl/loop/training.py``).

By default the policy is a tiny random Llama (2 layers, hidden 64) with the embedded SmolLM2 tokenizer, and the
questions and the corpus are the shipped sample (``ziprl/data/sample`` and its prebuilt FAISS index), so it runs on
a laptop CPU in seconds. A random model writes noise: its turns are malformed and its rewards 0, so its step has no
signal (every advantage is 0) and only shows the plumbing; ``--model DIR`` (a Stage 1 checkpoint, say) shows real
advantages and a real update.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from ziprl.config import ModelConfig, RetrieverConfig, load_config  # noqa: E402
from ziprl.env import SearchCompressEnv  # noqa: E402
from ziprl.learner.advantages import compute_advantages  # noqa: E402
from ziprl.learner.batch import build_rows, make_micro_batches, response_logprobs  # noqa: E402
from ziprl.loop.in_process import InProcessPush  # noqa: E402
from ziprl.policy import make_engine  # noqa: E402
from ziprl.policy.models import build_tiny_llama, load_model, resolve_model_path, torch_dtype  # noqa: E402
from ziprl.policy.rollout import rollout_groups  # noqa: E402
from ziprl.registry import LOSSES  # noqa: E402
from ziprl.retrieval.datasets import load_dataset  # noqa: E402
from ziprl.retrieval.retriever import Retriever  # noqa: E402


def one_step(model_dir: Path, questions: int = 2, group_size: int = 2, seed: int = 0) -> dict[str, float]:
    """One step from ``model_dir``'s weights; returns what each stage produced."""
    cfg = load_config(None, [f"rollout.group_size={group_size}", "env.max_turns=2", "sampling.max_new_tokens=32",
                             "learner.lr=1e-4", "model.device=cpu"])
    lc = cfg.learner
    torch.manual_seed(seed)

    # 1. Rollout: G episodes per question through the env, one generation batch per turn; every turn keeps its
    #    prompt and response token ids, the engine's (behaviour) log-probs and its Q_com.
    examples = load_dataset("sample", limit=questions, seed=seed)
    retriever = Retriever.from_config(RetrieverConfig())  # the shipped sample's prebuilt index
    engine = make_engine(cfg.model, model_dir)
    groups = rollout_groups(engine, lambda: SearchCompressEnv(cfg.env, retriever=retriever, examples=examples),
                            examples, cfg.sampling, cfg.rollout.group_size, seed)
    trajectories = [t for group in groups for t in group]

    # 2. Advantages: GRPO per trajectory, A_i = (R_i - mean_group) / (std_group + eps), then HRR per turn,
    #    A_ij = A_i + w (Q_ij - Q_bar_i) (ziprl/learner/advantages/: learner.advantage_estimator).
    adv = compute_advantages(trajectories, lc)

    # 3. Loss: one training row per turn (its response tokens weighted 1 / (G |o_i|), learner.loss_norm), in
    #    micro-batches; the ZipRL objective, -sum_t w_t (min(rho A, clip(rho) A) - beta KL_t) (learner.policy_loss).
    #    Gradients accumulate over micro-batches: each loss is a weighted sum over the whole batch's normalisation.
    policy = load_model(model_dir).train()
    reference = load_model(model_dir).requires_grad_(False)  # the frozen start, for the KL term
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lc.lr, weight_decay=lc.weight_decay)
    rows = build_rows(adv.trajectories, adv.turn_advantages, lc.loss_norm,
                      budget=cfg.env.max_turns * cfg.sampling.max_new_tokens)
    policy_loss = LOSSES[lc.policy_loss]
    loss_sum = 0.0
    for mb in make_micro_batches(rows, lc.micro_batch_turns, pad_id=engine.tokenizer.pad_token_id):
        logp = response_logprobs(policy, mb)
        with torch.no_grad():
            ref_logp = response_logprobs(reference, mb)
        # float32 HF engine and float32 learner: the behaviour log-probs are the learner's, no rollout correction
        loss, _ = policy_loss(logp, mb.old_logp, mb.adv, mb.weight, mb.loss_mask, ref_logp, lc.beta, lc.clip_eps)
        loss.backward()
        loss_sum += loss.item()

    # 4. Optimizer step: clip the gradient's global norm, one AdamW update; the policy is now version 1.
    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), lc.max_grad_norm))
    optimizer.step()
    optimizer.zero_grad()

    # 5. Weight push: the new weights into the engine that generates the next step's rollouts, copied where and in
    #    the dtype the engine takes them (its weights_device / weights_dtype).
    def weights(device: str, dtype: str) -> dict[str, torch.Tensor]:
        return {name: p.detach().to(device, torch_dtype(dtype), copy=True) for name, p in policy.named_parameters()}

    pushed = InProcessPush(weights, engine).push(version=1)

    return {"trajectories": float(len(trajectories)), "turns": float(len(rows)),
            "reward": sum(t.reward for t in trajectories) / len(trajectories),
            "adv_std": adv.stats["adv_std"], "hrr_abs_mean": adv.stats["hrr_abs_mean"], "loss": loss_sum,
            "grad_norm": grad_norm, "pushed_bytes": pushed["bytes"], "engine_version": float(engine.version)}


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="an HF checkpoint directory (default: a tiny random Llama)")
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_tiny_llama(resolve_model_path(ModelConfig()), Path(tmp) / "tiny-llama")
        out = one_step(model, args.questions, args.group_size, args.seed)
    for key, value in out.items():
        print(f"{key:>16}: {value:.6g}")
    return out


if __name__ == "__main__":
    main()
