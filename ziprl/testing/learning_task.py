"""The learning gate's tasks, learnable in seconds by a tiny model through ``ziprl.train``'s production path.

Stage 1 fine-tunes a 2-layer random Llama (SmolLM2's tokenizer) on demonstrations played through the real env;
each task's reward then rises only when the update trains the right tokens with the right sign, steps the
optimizer and reaches the generating engine.

- The bandit: one turn, every question asks for a colour, the gold answer is GOLD. Demonstrations
  ``"<colour> <answer><colour></answer>"`` with the four colours equally often start the policy at ~1/4 (EM on
  ``<answer>``); the first response token decides the answer (Stage 1 teaches the answer to copy it).
- The search task: three turns (search the door, search a colour, answer with the code phrase the search
  returned), trained as the default run trains: the reward is decided on turn 2 and paid on turn 3, a step's turns
  go through several micro-batches that run their shared prefixes once, the KL to the reference is on, and
  rollouts run one policy version ahead of the learner.
- The HRR check: every reward 0, so only HRR's per-turn term can move the compress levels (Q_com).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import random
import re
import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ziprl.config import ZipRLConfig, load_config
from ziprl.loop.summary import step_rows


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
GATE_SEED = 1  # CI's seed and the mutations' (every seed's margin: benchmarks/results/learning_gate.md)
# CI's second seed (the bandit's and the HRR check's), run only when GATE_SEED's run fails: a 16-step run's trajectory
# depends in its last bits on the process's history and on how the learner sums (in one full test run on an AMD EPYC
# with AVX-512 BF16, seed 1's bf16 bandit collapsed to 0 in its last two steps, then passed alone, at 0.81); every
# mutation fails at both seeds
# (benchmarks/results/learning_gate_bandit_epyc.md)
FALLBACK_SEED = 2
START_STEPS, END_STEPS = 2, 4  # the starting rate is the mean of the first 2 steps, the end rate of the last 4
MIN_END, MIN_GAIN = 0.6, 0.3  # pass: end rate >= 0.6 and >= start rate + 0.3
MAX_START = 0.45  # the starting rate sits near chance (1/4): nothing was learned before RL
MAX_ONPOLICY_GAP = 1e-3  # float32 engine and learner: |log pi_learner - log pi_rollout| per token, on-policy
MAX_BF16_GAP = 0.02  # bf16 engine and learner (measured 0.003-0.01 per token; truncated IS weighs the rest)


def verdict(rates: list[float], gap: float, max_gap: float) -> dict:
    """The gate's numbers from a run's per-step success rates and its on-policy gap, and whether it passes."""
    start, end = statistics.fmean(rates[:START_STEPS]), statistics.fmean(rates[-END_STEPS:])
    ok = end >= MIN_END and end - start >= MIN_GAIN and gap <= max_gap
    return {"rates": rates, "start": start, "end": end, "onpolicy_gap": gap, "passed": ok}


def max_gap(cfg: ZipRLConfig) -> float:
    """The on-policy bound of a run's precision."""
    return MAX_BF16_GAP if cfg.learner.bf16 else MAX_ONPOLICY_GAP


def metrics_rows(out_dir: Path) -> list[dict]:
    return step_rows((out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines())


# ---------------------------------------------------------------- the bandit: one turn, float32 or bf16

QUESTIONS = ("Which colour is the sky over the sea at noon?", "Name a colour that you like.",
             "What colour should the new door be?", "Pick one colour for the team shirts.")
# lr 3e-3 warmed up over 3 steps: Adam's first, sign-like step at full lr left 2 of 5 seeds answering malformed from
# step 2 on (every reward 0, so nothing trains them back); warmed up, 1 of 5 (benchmarks/results/learning_gate.md)
STEPS, LR, WARMUP = 16, 3e-3, 3
# the bf16 learner (and engine) with the KL to the reference: without it 4 of 5 seeds failed (1 of 5 warmed up)
BF16 = ("learner.bf16=true", "learner.beta=0.1")


def write_dataset(path: Path) -> Path:
    """The bandit's questions as a unified-schema JSONL file, with a one-passage-per-colour corpus beside it."""
    lines = [json.dumps({"id": f"gate-{i}", "question": q, "answers": [GOLD]}) for i, q in enumerate(QUESTIONS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    passages = [json.dumps({"id": f"c{i}", "title": c.title(), "text": f"{c.title()} is a colour."})
                for i, c in enumerate(COLOURS * 2)]
    (path.parent / "corpus.jsonl").write_text("\n".join(passages) + "\n", encoding="utf-8")
    return path


def gate_config(dataset: Path, out_dir: Path, model_dir: Path, seed: int, steps: int = STEPS, lr: float = LR,
                extra: Sequence[str] = ()) -> ZipRLConfig:
    """The bandit's settings: react strategy (no compression owed), one turn, 2 questions x G = 8 per step,
    float32 learner (the engine's numerics exactly, so on-policy log-probs must agree) unless ``extra`` says bf16."""
    return load_config(None, [
        f"data.dataset={dataset}", "env.strategy=react", "env.max_turns=1", "env.reward=em",
        "sampling.max_new_tokens=16", "sampling.temperature=1.0", "rollout.group_size=8",
        "learner.global_batch_questions=2", "learner.micro_batch_turns=16", f"learner.steps={steps}",
        f"learner.lr={lr}", f"learner.warmup_steps={WARMUP}", "learner.beta=0.0", "learner.hrr_weight=0.0",
        f"learner.seed={seed}", f"data.seed={seed}", "ray.max_staleness=0", f"run.checkpoint_every={steps + 1}",
        f"run.out_dir={out_dir}", f"run.sft_checkpoint={model_dir}", "learner.bf16=false", *extra,
    ])


@one_thread
def cold_start(base_model: Path, dataset: Path, out_dir: Path, steps: int = 120, lr: float = 3e-3) -> Path:
    """Stage 1 for the bandit: SFT on the four colour answers equally often; returns the model directory."""
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


@one_thread
def run_gate(stage1: Path, dataset: Path, out_dir: Path, seed: int, mutation: str | None = None,
             extra: Sequence[str] = ()) -> dict:
    """Train the bandit through ``ziprl.train``'s production path (optionally mutated, ``extra`` config overrides
    after the gate's own); its verdict, the reward (EM) being the success rate."""
    from ziprl.loop.in_process import train

    cfg = gate_config(dataset, out_dir, stage1, seed, extra=extra)
    with mutated(mutation):
        train(cfg, progress=False)
    rows = metrics_rows(out_dir)
    # a zero-gradient step (every group's rewards equal, beta = 0) runs no forward, so it measures no on-policy gap
    gap = max((m["learner/mismatch_abs_mean"] for m in rows if not m.get("learner/zero_gradient")), default=0.0)
    return {"seed": seed, "mutation": mutation or "none",
            **verdict([m["rollout/reward"] for m in rows], gap, max_gap(cfg))}


# ---------------------------------------------------------------- the search task: three turns, the default path

CODES = {"red": "wolf", "green": "bear", "blue": "fish", "gold": "bird"}  # the code word of each colour's passage
TAIL = "stone wood iron"  # every passage's code phrase ends so
# Turn 1 always searches the door (its passage names no colour and no code): a turn's prompt sorts before the earlier
# turns' (it goes on where theirs has its footer), so a step's last micro-batch holds only these decision-free rows.
DOOR = "door"
SEARCH_QUESTIONS = ("Which colour opens the door? Search it, then copy its code phrase.",
                    "Which colour opens the door? Search it, then copy its code word.")
KEEPER = "said the keeper of the doors to each traveller who came by at dusk or dawn on foot"  # 16 words
SEARCH_STEPS, SEARCH_LR, SEARCH_BETA = 20, 2e-3, 0.1  # lr 3e-3: the format broke mid-run on 2 of 5 seeds


def phrase(colour: str) -> str:
    """The code phrase of ``colour``'s passage."""
    return f"{CODES[colour]} {TAIL}"


def search_golds() -> list[list[str]]:
    """Each question's gold answers, so that F1 depends far more on the question than on the search: the first
    scores the right phrase 1 and a wrong one 0.89 (a gold is each wrong phrase and one word more), the second the
    right phrase 0.1 (its code word among 16 other words) and a wrong one 0. Within a group only the search matters;
    a baseline taken across both questions gives every answer to the first a positive advantage and every answer to
    the second a negative one, the right ones included."""
    first = [phrase(GOLD)] + [f"{phrase(c)} {DOOR}" for c in COLOURS if c != GOLD]
    return [first, [f"{CODES[GOLD]} {KEEPER}"]]


def search_passages() -> list:
    """The search task's corpus: the door's passage, then one passage per colour holding its code phrase."""
    from ziprl.retrieval.types import Passage

    return [Passage("door", DOOR.title(), "Four doors stand in a row."),
            *(Passage(f"c{i}", c.title(), phrase(c)) for i, c in enumerate(COLOURS))]


def write_search_dataset(path: Path) -> Path:
    """The search task's two questions (:func:`search_golds`) as a JSONL file, its corpus beside it."""
    lines = [json.dumps({"id": f"search-{i}", "question": q, "answers": golds})
             for i, (q, golds) in enumerate(zip(SEARCH_QUESTIONS, search_golds(), strict=True))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    passages = [json.dumps({"id": p.doc_id, "title": p.title, "text": p.text}) for p in search_passages()]
    (path.parent / "corpus.jsonl").write_text("\n".join(passages) + "\n", encoding="utf-8")
    return path


def search_config(dataset: Path, out_dir: Path, model_dir: Path, seed: int, extra: Sequence[str] = ()) -> ZipRLConfig:
    """What the default run does, on the search task: three turns, F1 reward, 2 questions x G = 8 per step in
    micro-batches of 4 turns (the default) that run their shared prefixes once, beta > 0 (k3 KL to the Stage-1
    reference), rollouts one policy version ahead of the learner (``ray.max_staleness=1`` with
    :func:`rollouts_ahead`), lr warmed up over 3 steps; float32 unless ``extra`` says otherwise."""
    return load_config(None, [
        f"data.dataset={dataset}", "env.strategy=react", "env.max_turns=3", "env.reward=f1", "env.top_k=1",
        "sampling.max_new_tokens=16", "sampling.temperature=1.0", "rollout.group_size=8",
        "learner.global_batch_questions=2", "learner.micro_batch_turns=4", "learner.share_prefix=true",
        "learner.probe_update=false", f"learner.steps={SEARCH_STEPS}", f"learner.lr={SEARCH_LR}",
        "learner.warmup_steps=3", f"learner.beta={SEARCH_BETA}", "learner.hrr_weight=0.0", f"learner.seed={seed}",
        f"data.seed={seed}", "ray.max_staleness=1", f"run.checkpoint_every={SEARCH_STEPS + 1}",
        f"run.out_dir={out_dir}", f"run.sft_checkpoint={model_dir}", "learner.bf16=false", *extra,
    ])


@one_thread
def search_cold_start(base_model: Path, dataset: Path, out_dir: Path, steps: int = 300, lr: float = 3e-3) -> Path:
    """Stage 1 for the search task: whole episodes played through the env, every colour searched equally often
    (the policy starts near 1/4), the answer copying the code phrase the search returned. Each SFT step holds 6
    answer turns and 2 search turns: the copy is what takes long (measured: sharp after ~200 steps)."""
    from ziprl.env import SearchCompressEnv
    from ziprl.learner.sft import sft_rows
    from ziprl.learner.trainer import Trainer
    from ziprl.retrieval.datasets import load_dataset
    from ziprl.testing.word_retriever import WordRetriever

    cfg = search_config(dataset, out_dir / "unused", base_model, 0)
    cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, lr=lr, beta=0.0, warmup_steps=0))
    examples = load_dataset(str(dataset))
    env = SearchCompressEnv(cfg.env, retriever=WordRetriever(search_passages()), examples=examples)
    searches, answers = [], []
    for ex in examples:
        for c in COLOURS:
            _, info = env.reset(seed=0, options={"example": ex})
            for demos, response in ((searches, f"<search>{DOOR}</search>"), (searches, f"<search>{c}</search>"),
                                    (answers, f"<answer>{phrase(c)}</answer>")):
                demos.append({"messages": info["messages"], "response": response})
                *_, info = env.step(response)
    trainer = Trainer(cfg, base_model)
    searches, answers = (sft_rows(d, trainer.tokenizer, cfg.sft.max_seq_len) for d in (searches, answers))
    rng = random.Random(0)
    for _ in range(steps):
        trainer.sft_step(rng.sample(answers, 6) + rng.sample(searches, 2), micro_batch_size=4)
    return trainer.save_pretrained(out_dir)


def answered_gold(traj) -> bool:
    """Whether an episode's answer is the gold colour's code phrase (what the right search returns)."""
    found = re.search(r"<answer>(.*?)</answer>", traj.turns[-1].response_text if traj.turns else "", re.DOTALL)
    return found is not None and " ".join(found.group(1).split()) == phrase(GOLD)


@contextlib.contextmanager
def rollouts_ahead() -> Iterator[None]:
    """``ziprl.train``'s in-process source made to generate a job when the scheduler submits it (as a rollout actor
    does), not when the loop waits for it: with ``ray.max_staleness=1`` every step after the first then trains
    groups generated one policy version before, so the ratio's behaviour log-probs are one version old."""
    from collections import deque

    from ziprl.loop import in_process

    class AheadSource(in_process.InProcessSource):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._done: deque = deque()

        def submit(self, worker: int, ticket: int, examples: list, seed: int) -> None:
            super().submit(worker, ticket, examples, seed)
            self._done.extend(super().wait())

        def wait(self) -> list:
            return [self._done.popleft()]

    real = in_process.InProcessSource
    in_process.InProcessSource = AheadSource
    try:
        yield
    finally:
        in_process.InProcessSource = real


@one_thread
def run_search(stage1: Path, dataset: Path, out_dir: Path, seed: int, mutation: str | None = None,
               extra: Sequence[str] = ()) -> dict:
    """Train the search task through ``ziprl.train``'s path with rollouts one version ahead (optionally mutated,
    ``extra`` config overrides); its verdict, and what the run exercised: steps that trained one-version-old groups,
    the fewest micro-batches of a step, the largest clipped fraction, the KL of the last steps."""
    from ziprl.env.trajectory import load_trajectories
    from ziprl.loop.in_process import train

    cfg = search_config(dataset, out_dir, stage1, seed, extra)
    with mutated(mutation), rollouts_ahead():
        train(cfg, progress=False)
    rows = metrics_rows(out_dir)
    rates = [statistics.fmean(map(answered_gold, load_trajectories(path)))
             for path in sorted((out_dir / "trajectories").glob("step_*.parquet"))]
    gap = rows[0]["learner/mismatch_abs_mean"]  # the first step is the one that trains on-policy groups (lag 0)
    return {"seed": seed, "mutation": mutation or "none", **verdict(rates, gap, max_gap(cfg)),
            "stale_steps": sum(m["system/staleness"] == 1 for m in rows),
            "passes": min(m.get("learner/passes", 0.0) for m in rows),
            "clip_frac_max": max(m["learner/clip_frac"] for m in rows),
            "kl_end": statistics.fmean(m["learner/kl"] for m in rows[-END_STEPS:])}


# ---------------------------------------------------------------- mutations the gate must catch

MUTATIONS = ("advantage_sign", "loss_mask_shift_right", "loss_mask_shift_left", "no_optimizer_step",
             "no_weight_push", "behaviour_logp_shifted", "advantage_on_last_turn", "baseline_across_questions",
             "last_micro_batch_only", "kl_sign_flipped")
HRR_CONTROLS = ("hrr_weight_negated", "hrr_scores_shuffled")


@contextlib.contextmanager
def mutated(name: str | None) -> Iterator[None]:
    """Break one part of the update path for the duration (None: the code as it is)."""
    import torch

    from ziprl.env.group import Group
    from ziprl.learner import advantages, batch, trainer
    from ziprl.learner import step as step_module
    from ziprl.policy.engines.hf import engine as hf_engine

    patches: list[tuple[object, str, object]] = []

    def patch(obj: object, attr: str, new: object) -> None:
        patches.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, new)

    def turn_advantages(change: Callable[[list[float]], list[float]]) -> None:
        real = step_module.compute_advantages

        def changed(groups, lc):
            out = real(groups, lc)
            return dataclasses.replace(out, turn_advantages=[change(t) for t in out.turn_advantages])
        patch(step_module, "compute_advantages", changed)

    if name == "advantage_sign":
        turn_advantages(lambda t: [-a for a in t])
    elif name == "advantage_on_last_turn":  # each trajectory's outcome advantage on its last turn only
        turn_advantages(lambda t: [0.0] * (len(t) - 1) + t[-1:])
    elif name == "baseline_across_questions":  # one group for the whole batch: mean and std over every question
        real = step_module.compute_advantages
        patch(step_module, "compute_advantages", lambda groups, lc: real(
            [Group(tuple(dataclasses.replace(t, group_id="batch", question_id="batch") for g in groups for t in g))],
            lc))
    elif name in ("loss_mask_shift_right", "loss_mask_shift_left"):
        real_collate, step = batch.collate, 1 if name.endswith("right") else -1

        def shifted(rows, pad_id, *args, **kwargs):
            mb = real_collate(rows, pad_id, *args, **kwargs)
            mask = torch.roll(mb.loss_mask, step, dims=1)
            mask[:, 0 if step > 0 else -1] = 0
            return dataclasses.replace(mb, loss_mask=mask)
        for module in (batch, trainer):  # the trainer calls the name it imported
            patch(module, "collate", shifted)
    elif name == "last_micro_batch_only":  # the gradient of every micro-batch but the step's last is lost
        real_backward = step_module.backward_pass
        patch(step_module, "backward_pass",
              lambda model, loss, prefix, last: real_backward(model, loss if last else loss * 0.0, prefix, last))
    elif name == "no_optimizer_step":
        def no_step(self):
            self.engine.optimizer.zero_grad()
            self.global_step += 1
            self.policy_version += 1
            return 0.0
        patch(trainer.Trainer, "optimizer_step", no_step)
    elif name == "kl_sign_flipped":  # the objective adds beta * KL instead of subtracting it (the logged KL is right)
        real_loss = step_module.LOSSES["ppo_clip"]

        def plus_kl(logp, old_logp, adv, weight, mask, ref_logp, beta, *rest):
            loss, stats = real_loss(logp, old_logp, adv, weight, mask, ref_logp, beta, *rest)
            plain, _ = real_loss(logp, old_logp, adv, weight, mask, ref_logp, 0.0, *rest)
            return 2 * plain - loss, stats  # loss = plain + beta sum(w KL), so this is plain - beta sum(w KL)
        patch(step_module, "LOSSES", {**step_module.LOSSES, "ppo_clip": plus_kl})
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
    elif name == "hrr_weight_negated":  # A_ij = A_i - w (Q_ij - Q_bar_i), i.e. w = -0.2, which the config refuses
        real_hrr = advantages.hrr_turn_advantages
        patch(advantages, "hrr_turn_advantages", lambda a_traj, q_turns, w, *rest: real_hrr(a_traj, q_turns, -w, *rest))
    elif name == "hrr_scores_shuffled":  # each trajectory's Q_com permuted among its scored turns
        real, rng = step_module.compute_advantages, random.Random(0)
        patch(step_module, "compute_advantages",
              lambda groups, lc: real([Group(tuple(_shuffled_scores(t, rng) for t in g)) for g in groups], lc))
    elif name is not None:
        raise ValueError(f"unknown mutation {name!r}; one of {MUTATIONS + HRR_CONTROLS}")
    try:
        yield
    finally:
        for obj, attr, old in reversed(patches):
            setattr(obj, attr, old)


def _shuffled_scores(traj, rng: random.Random):
    """``traj`` with the Q_com of its scored turns in a random order (its unscored turns keep None)."""
    scored = [i for i, u in enumerate(traj.turns) if u.q_com is not None]
    turns = list(traj.turns)
    for i, j in zip(scored, rng.sample(scored, len(scored)), strict=True):
        turns[i] = dataclasses.replace(traj.turns[i], q_com=traj.turns[j].q_com)
    return dataclasses.replace(traj, turns=turns)


# ---------------------------------------------------------------- HRR on its own (outcome reward held constant)

HRR_NOTE = "The passages name a colour."  # 28 characters: inside level 1's range at level_scale 0.15, short for 2-5
HRR_STEPS, HRR_LR = 16, 3e-4  # 3e-3 collapses the policy: Adam scales the small HRR-only gradient to full steps
# lead: the mean Q_com of a run's last 8 steps minus the mean of every step of the same seed's w = 0 run (whose
# policy never moves: gradient 0). w = 0.2 must lead by at least this, w = -0.2 trail by at least this, and shuffled
# per-turn scores stay below it. Measured (benchmarks/results/learning_gate_hrr.md): w = 0 runs lead one another by
# at most 0.094 from sampling alone (8 seeds; their own seed's mean by at most 0.045), so the bar sits 1.17x above
# that drift; w = 0.2 led by 0.12-0.22 on 4 of 5 seeds (seed 1: 0.015, its last steps collapsing; 0.122 before the
# learner's packed rows shared prompt tokens, which changed the float sums and so every sampled trajectory), w = -0.2
# trailed by 0.22-0.37. Like the bandit, the check runs again at FALLBACK_SEED when GATE_SEED's fails.
HRR_MIN_LEAD = 0.11
HRR_RUNS = (("w=0.2", 0.2, None), ("w=0", 0.0, None), ("w=-0.2", 0.2, "hrr_weight_negated"),
            ("shuffled", 0.2, "hrr_scores_shuffled"))  # (name, w, mutation)


def write_hrr_dataset(path: Path) -> Path:
    """The bandit's questions with a gold answer no response can match (EM = 0 always: the reward is constant)."""
    write_dataset(path)
    lines = [json.dumps({"id": f"hrr-{i}", "question": q, "answers": ["no colour at all, ever"]})
             for i, q in enumerate(QUESTIONS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def hrr_config(dataset: Path, out_dir: Path, model_dir: Path, seed: int, w: float,
               steps: int = HRR_STEPS, lr: float = HRR_LR, extra: Sequence[str] = ()) -> ZipRLConfig:
    """Adaptive strategy, 3 turns (search; compress + search; compress + answer): two scored compress turns;
    ``extra``: config overrides after these."""
    return load_config(None, [
        f"data.dataset={dataset}", "env.strategy=adaptive", "env.max_turns=3", "env.reward=em", "env.top_k=2",
        "sampling.max_new_tokens=40", "sampling.temperature=1.0", "rollout.group_size=4",
        "learner.global_batch_questions=2", "learner.micro_batch_turns=4", "learner.probe_update=false",
        f"learner.steps={steps}", f"learner.lr={lr}", "learner.beta=0.0", f"learner.hrr_weight={w}",
        f"learner.seed={seed}", f"data.seed={seed}", "ray.max_staleness=0", f"run.checkpoint_every={steps + 1}",
        f"run.out_dir={out_dir}", f"run.sft_checkpoint={model_dir}", "learner.bf16=false",
        "learner.drop_zero_variance_groups=false", *extra,
    ])


@one_thread
def hrr_cold_start(base_model: Path, dataset: Path, out_dir: Path, steps: int = 150, lr: float = 3e-3) -> Path:
    """Stage 1 for the HRR check: whole 3-turn episodes played through the env, the compress level drawn
    uniformly from 1..5 on every turn with the same note, so only the level decides Q_com."""
    from ziprl.env import SearchCompressEnv
    from ziprl.learner.sft import sft_rows
    from ziprl.learner.trainer import Trainer
    from ziprl.retrieval.datasets import load_dataset
    from ziprl.retrieval.types import Passage
    from ziprl.testing.word_retriever import WordRetriever

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
        trainer.sft_step(rng.sample(rows, 8), micro_batch_size=4)
    return trainer.save_pretrained(out_dir)


@one_thread
def run_hrr(stage1: Path, dataset: Path, out_dir: Path, seed: int, w: float, mutation: str | None = None,
            extra: Sequence[str] = ()) -> dict:
    """Train with HRR weight ``w`` while every reward is 0 (optionally mutated; ``extra``: config overrides); the
    per-step mean Q_com, the mean of
    the first 2 steps (start), of the last 8 (end: one step's 16 compress turns move by ~0.08 from sampling alone)
    and of every step."""
    from ziprl.loop.in_process import train

    with mutated(mutation):
        train(hrr_config(dataset, out_dir, stage1, seed, w, extra=extra), progress=False)
    rows = metrics_rows(out_dir)
    q = [m["rollout/q_com"] for m in rows]
    return {"seed": seed, "w": w, "mutation": mutation or "none", "q_com": q,
            "rewards": [m["rollout/reward"] for m in rows], "start": statistics.fmean(q[:START_STEPS]),
            "end": statistics.fmean(q[len(q) // 2:]), "mean": statistics.fmean(q),
            "max_grad_norm": max(m["learner/grad_norm"] for m in rows),
            "hrr_abs_mean": statistics.fmean(m["learner/hrr_abs_mean"] for m in rows)}
