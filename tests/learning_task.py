"""The learning gate's task: a one-turn bandit played through the real env, learnable in seconds by a tiny model.

Every question asks for a colour; the gold answer is GOLD. Stage 1 fine-tunes a 2-layer random Llama (SmolLM2's
tokenizer) on demonstrations ``"<colour> <answer><colour></answer>"`` with the four colours equally often, so
the policy starts answering in the protocol's format with reward ~1/4 (EM on ``<answer>``). The first response
token decides the answer (Stage 1 teaches the answer to copy it), so only an update that trains the right
response tokens with the right sign, steps the optimizer and reaches the generating engine raises the reward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ziprl.config import ZipRLConfig, load_config


def one_thread(fn: Callable) -> Callable:
    """Run ``fn`` on one torch thread, then restore the count: float sums, hence every sampled trajectory, depend on
    the thread count, which other code in the process may have changed (an engine built with ``model.num_threads``),
    so the gate gave one result alone and another after other tests (HRR seed 1's lead: 0.092 on 2 threads, above
    the bar on 1)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)
    return wrapper


COLOURS = ("red", "green", "blue", "gold")
GOLD = "green"
QUESTIONS = ("Which colour is the sky over the sea at noon?", "Name a colour that you like.",
             "What colour should the new door be?", "Pick one colour for the team shirts.")


def write_dataset(path: Path) -> Path:
    """The gate's questions as a unified-schema JSONL file, with a one-passage-per-colour corpus beside it."""
    lines = [json.dumps({"id": f"gate-{i}", "question": q, "answers": [GOLD]}) for i, q in enumerate(QUESTIONS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    passages = [json.dumps({"id": f"c{i}", "title": c.title(), "text": f"{c.title()} is a colour."})
                for i, c in enumerate(COLOURS * 2)]
    (path.parent / "corpus.jsonl").write_text("\n".join(passages) + "\n", encoding="utf-8")
    return path


STEPS, LR = 16, 3e-3  # measured: reward 0.13 -> 0.88 over 16 steps (seed 0); see benchmarks/results/learning_gate.md
START_STEPS, END_STEPS = 2, 4  # the starting rate is the mean of the first 2 steps, the end rate of the last 4
MIN_END, MIN_GAIN = 0.6, 0.3  # pass: end rate >= 0.6 and >= start rate + 0.3 (chance is 1/4)
GATE_SEED = 1  # CI's seed, and the mutations'; seed 0 collapses at step 1 (benchmarks/results/learning_gate.md)
MAX_ONPOLICY_GAP = 1e-3  # float32 engine and learner: |log pi_learner - log pi_rollout| per token, on-policy


def gate_config(dataset: Path, out_dir: Path, model_dir: Path, seed: int, steps: int = STEPS, lr: float = LR,
                extra: Sequence[str] = ()) -> ZipRLConfig:
    """The gate's settings: react strategy (no compression owed), one turn, 2 questions x G = 8 per step,
    float32 learner (the engine's numerics exactly, so on-policy log-probs must agree)."""
    return load_config(None, [
        f"data.dataset={dataset}", "env.strategy=react", "env.max_turns=1", "env.reward=em",
        "sampling.max_new_tokens=16", "sampling.temperature=1.0", "rollout.group_size=8",
        "learner.global_batch_questions=2", "learner.micro_batch_turns=16", f"learner.steps={steps}",
        f"learner.lr={lr}", "learner.beta=0.0", "learner.hrr_weight=0.0", f"learner.seed={seed}",
        f"data.seed={seed}", "ray.max_staleness=0", f"run.checkpoint_every={steps + 1}", f"run.out_dir={out_dir}",
        f"run.sft_checkpoint={model_dir}", "learner.bf16=false", *extra,
    ])


@one_thread
def cold_start(base_model: Path, dataset: Path, out_dir: Path, steps: int = 120, lr: float = 3e-3) -> Path:
    """Stage 1 for the gate: SFT on the four colour answers equally often; returns the model directory."""
    from ziprl.env import SearchCompressEnv
    from ziprl.learner.sft import sft_rows
    from ziprl.learner.trainer import Trainer
    from ziprl.retrieval.datasets import load_dataset

    cfg = load_config(None, [f"data.dataset={dataset}", "env.strategy=react", "env.max_turns=1",
                             f"learner.lr={lr}", "learner.beta=0.0", "learner.bf16=false"])
    examples = load_dataset(str(dataset))
    env = SearchCompressEnv(cfg.env, retriever=_NoRetriever(), examples=examples)
    demos = []
    for ex in examples:
        _, info = env.reset(seed=0, options={"example": ex})
        demos += [{"messages": info["messages"], "response": f"{c} <answer>{c}</answer>"} for c in COLOURS]
    trainer = Trainer(cfg, base_model)
    rows = sft_rows(demos, trainer.tokenizer, cfg.sft.max_seq_len)
    rng = random.Random(0)
    for _ in range(steps):
        trainer.sft_step(rng.sample(rows, 8), micro_batch_size=8)
    return trainer.save_pretrained(out_dir)


class _NoRetriever:
    """The cold start renders first-turn prompts only; nothing searches."""

    def __len__(self) -> int:
        return 10**6  # any size >= env.top_k


def verdict(metrics: list[dict]) -> dict:
    """The gate's numbers from a run's metrics.jsonl rows, and whether it passes."""
    rewards = [m["rollout/reward"] for m in metrics]
    start = sum(rewards[:START_STEPS]) / START_STEPS
    end = sum(rewards[-END_STEPS:]) / END_STEPS
    # a zero-gradient step (every group's rewards equal) runs no forward, so it measures no on-policy gap
    gap = max(m["learner/mismatch_abs_mean"] for m in metrics if not m.get("learner/zero_gradient"))
    ok = end >= MIN_END and end - start >= MIN_GAIN and gap <= MAX_ONPOLICY_GAP
    return {"rewards": rewards, "start": start, "end": end, "max_onpolicy_gap": gap, "passed": ok}


@one_thread
def run_gate(stage1: Path, dataset: Path, out_dir: Path, seed: int, mutation: str | None = None,
             extra: Sequence[str] = ()) -> dict:
    """Train the gate's steps through ``ziprl.train``'s production path (optionally mutated, ``extra`` config
    overrides after the gate's own); its verdict."""
    from ziprl.loop.in_process import train

    with mutated(mutation):
        train(gate_config(dataset, out_dir, stage1, seed, extra=extra), progress=False)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {"seed": seed, "mutation": mutation or "none", **verdict(rows)}


# ---------------------------------------------------------------- mutations the gate must catch

MUTATIONS = ("advantage_sign", "loss_mask_shift_right", "loss_mask_shift_left", "no_optimizer_step",
             "no_weight_push", "behaviour_logp_shifted")


@contextlib.contextmanager
def mutated(name: str | None) -> Iterator[None]:
    """Break one part of the update path for the duration (None: the code as it is)."""
    import torch

    from ziprl.learner import batch, trainer
    from ziprl.policy import hf_engine

    patches: list[tuple[object, str, object]] = []

    def patch(obj: object, attr: str, new: object) -> None:
        patches.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, new)

    if name == "advantage_sign":
        real = trainer.compute_advantages

        def flipped(trajs, lc):
            out = real(trajs, lc)
            return dataclasses.replace(out, turn_advantages=[[-a for a in t] for t in out.turn_advantages])
        patch(trainer, "compute_advantages", flipped)
    elif name in ("loss_mask_shift_right", "loss_mask_shift_left"):
        real_collate, step = batch.collate, 1 if name.endswith("right") else -1

        def shifted(rows, pad_id, *args, **kwargs):
            mb = real_collate(rows, pad_id, *args, **kwargs)
            mask = torch.roll(mb.loss_mask, step, dims=1)
            mask[:, 0 if step > 0 else -1] = 0
            return dataclasses.replace(mb, loss_mask=mask)
        patch(batch, "collate", shifted)
    elif name == "no_optimizer_step":
        def no_step(self):
            self.engine.optimizer.zero_grad()
            self.global_step += 1
            self.policy_version += 1
            return 0.0
        patch(trainer.Trainer, "_optimizer_step", no_step)
    elif name == "no_weight_push":  # the engine takes the new version number but keeps its old weights
        def version_only(self, named_arrays, version):
            self.version = version
        patch(hf_engine.HFEngine, "load_weights", version_only)
    elif name == "behaviour_logp_shifted":
        real_generate = hf_engine.HFEngine.generate

        def wrong_tokens(self, *args, **kwargs):  # each token reports the log-prob of the token after it
            return [dataclasses.replace(g, logprobs=[*g.logprobs[1:], g.logprobs[-1]] if g.logprobs else [])
                    for g in real_generate(self, *args, **kwargs)]
        patch(hf_engine.HFEngine, "generate", wrong_tokens)
    elif name is not None:
        raise ValueError(f"unknown mutation {name!r}; one of {MUTATIONS}")
    try:
        yield
    finally:
        for obj, attr, old in reversed(patches):
            setattr(obj, attr, old)



# ---------------------------------------------------------------- HRR on its own (outcome reward held constant)

HRR_NOTE = "The passages name a colour."  # 28 characters: inside level 1's range at level_scale 0.15, short for 2-5
HRR_STEPS, HRR_LR = 16, 3e-4  # 3e-3 collapses the policy: Adam scales the small HRR-only gradient to full steps
HRR_MIN_GAIN = 0.05  # w = 0.2: the mean Q_com of the last 8 steps exceeds the first 2 steps' by at least this
HRR_MIN_LEAD = 0.1  # ... and the mean of every step of the same seed's w = 0 run (it never changes: gradient 0) by
# at least this (measured: +0.11 to +0.17 over 3 seeds; benchmarks/results/learning_gate_hrr.md)


def write_hrr_dataset(path: Path) -> Path:
    """The gate's questions with a gold answer no response can match (EM = 0 always: the reward is constant)."""
    write_dataset(path)
    lines = [json.dumps({"id": f"hrr-{i}", "question": q, "answers": ["no colour at all, ever"]})
             for i, q in enumerate(QUESTIONS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def hrr_config(dataset: Path, out_dir: Path, model_dir: Path, seed: int, w: float,
               steps: int = HRR_STEPS, lr: float = HRR_LR) -> ZipRLConfig:
    """Adaptive strategy, 3 turns (search; compress + search; compress + answer): two scored compress turns."""
    return load_config(None, [
        f"data.dataset={dataset}", "env.strategy=adaptive", "env.max_turns=3", "env.reward=em", "env.top_k=2",
        "sampling.max_new_tokens=40", "sampling.temperature=1.0", "rollout.group_size=4",
        "learner.global_batch_questions=2", "learner.micro_batch_turns=24", f"learner.steps={steps}",
        f"learner.lr={lr}", "learner.beta=0.0", f"learner.hrr_weight={w}", f"learner.seed={seed}",
        f"data.seed={seed}", "ray.max_staleness=0", f"run.checkpoint_every={steps + 1}", f"run.out_dir={out_dir}",
        f"run.sft_checkpoint={model_dir}", "learner.bf16=false", "learner.drop_zero_variance_groups=false",
    ])


@one_thread
def hrr_cold_start(base_model: Path, dataset: Path, out_dir: Path, steps: int = 150, lr: float = 3e-3) -> Path:
    """Stage 1 for the HRR check: whole 3-turn episodes played through the env, the compress level drawn
    uniformly from 1..5 on every turn with the same note, so only the level decides Q_com."""
    from tests.conftest import WordRetriever
    from ziprl.env import SearchCompressEnv
    from ziprl.learner.sft import sft_rows
    from ziprl.learner.trainer import Trainer
    from ziprl.retrieval.datasets import load_dataset
    from ziprl.retrieval.types import Passage

    cfg = hrr_config(dataset, out_dir / "unused", base_model, 0, 0.2)
    cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, lr=lr))
    examples = load_dataset(str(dataset))
    passages = [Passage(f"c{i}", c.title(), f"{c.title()} is a colour.") for i, c in enumerate(COLOURS * 2)]
    env = SearchCompressEnv(cfg.env, retriever=WordRetriever(passages), examples=examples)
    rng, demos = random.Random(0), []
    for _ in range(10):
        for ex in examples:
            _, info = env.reset(seed=0, options={"example": ex})
            turns = ['<compress level="1">Start.</compress><search>colour</search>',
                     f'<compress level="{rng.randint(1, 5)}">{HRR_NOTE}</compress><search>colour</search>',
                     f'<compress level="{rng.randint(1, 5)}">{HRR_NOTE}</compress><answer>blue</answer>']
            for response in turns:
                demos.append({"messages": info["messages"], "response": response})
                *_, info = env.step(response)
    trainer = Trainer(cfg, base_model)
    rows = sft_rows(demos, trainer.tokenizer, cfg.sft.max_seq_len)
    for _ in range(steps):
        trainer.sft_step(rng.sample(rows, 8), micro_batch_size=8)
    return trainer.save_pretrained(out_dir)


@one_thread
def run_hrr(stage1: Path, dataset: Path, out_dir: Path, seed: int, w: float) -> dict:
    """Train with HRR weight ``w`` while every reward is 0; the per-step mean Q_com and its change."""
    from ziprl.loop.in_process import train

    train(hrr_config(dataset, out_dir, stage1, seed, w), progress=False)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    q = [m["rollout/q_com"] for m in rows]
    # end: the second half's mean (16 compress turns a step: one step's mean moves by ~0.08 from sampling alone)
    start, end = statistics.fmean(q[:START_STEPS]), statistics.fmean(q[len(q) // 2:])
    return {"seed": seed, "w": w, "q_com": q, "rewards": [m["rollout/reward"] for m in rows], "start": start,
            "end": end, "mean": statistics.fmean(q), "gain": end - start, "max_grad_norm": max(m["learner/grad_norm"] for m in rows),
            "hrr_abs_mean": sum(m["learner/hrr_abs_mean"] for m in rows) / len(rows)}
