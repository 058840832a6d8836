"""The paper's update as one function: on a tiny model, :func:`update_step`'s loss and gradient equal Eq. J_ZipRL
computed by hand (GRPO advantages, HRR's per-turn term, the clipped surrogate, the k3 KL, the 1/(G |o_i|) weights),
over any micro-batching; a step with nothing to learn takes no forward, and one with no rows no update."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ziprl.config import ZipRLConfig
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.learner.batch import collate, make_micro_batches, shared_prompt_len
from ziprl.learner.step import update_step
from ziprl.learner.step_stats import StepStats

PAD = 0
SYSTEM = [11, 12, 13, 14, 15]  # every prompt starts with it: micro-batches run it once


class TinyLearner:
    """A plain-torch Trainable (step.Trainable) that keeps the gradient each optimizer step saw."""

    zero_stage = 0
    device = torch.device("cpu")
    tis_cap = None
    packed = False  # run every micro-batch packed, its rows sharing their common prompt tokens (ziprl.learner.packing)

    def __init__(self, cfg: ZipRLConfig, policy: torch.nn.Module, reference: torch.nn.Module | None) -> None:
        self.cfg, self.policy, self.reference = cfg, policy, reference
        self.at_reference = False
        self.policy_version = 0
        self.optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
        self.grads: list[torch.Tensor] = []
        self.forwards = 0
        policy.register_forward_hook(lambda *_: self._count())

    def _count(self) -> None:
        self.forwards += 1

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def compute(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def micro_batches(self, rows):
        batches = make_micro_batches(rows, self.cfg.learner.micro_batch_turns, PAD, share_prefix=True)
        return [(dataclasses.replace(mb, packed=self.packed, share_rows=self.packed), True) for mb in batches], None

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> float:
        self.grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in self.policy.parameters()]
        norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), float("inf")))
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.policy_version += 1
        return norm


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    policy = LlamaForCausalLM(cfg).float()
    reference = copy.deepcopy(policy).requires_grad_(False)
    with torch.no_grad():  # a reference that differs: the KL term is not 0
        for p in reference.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    return policy, reference


def make_cfg(**learner) -> ZipRLConfig:
    cfg = ZipRLConfig()
    for key, value in {"clip_eps": 0.2, "beta": 0.1, "hrr_weight": 0.5, "loss_norm": "trajectory",
                       "probe_update": True, **learner}.items():
        setattr(cfg.learner, key, value)
    return cfg


def make_groups() -> list[Group]:
    """Two questions, two trajectories each; the first trajectory of each has two scored turns (HRR moves them apart),
    behaviour log-probs off the learner's so that some ratios clip."""
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(20, 64, (n,), generator=g).tolist()

    def turn(prompt: int, response: int, q: float | None) -> Turn:
        lp = (-3.0 - torch.rand(response, generator=g)).tolist()
        return Turn(prompt_ids=SYSTEM + ids(prompt), response_ids=ids(response), logprobs=lp, q_com=q)

    def traj(question: str, reward: float, turns: list[Turn]) -> Trajectory:
        return Trajectory(question_id=question, question=question, answers=["a"], group_id=question, reward=reward,
                          turns=turns)

    return [Group((traj("q1", 1.0, [turn(3, 4, 0.9), turn(5, 2, 0.1)]), traj("q1", 0.0, [turn(2, 3, None)]))),
            Group((traj("q2", 0.0, [turn(4, 3, 0.2), turn(3, 3, 0.6)]), traj("q2", 1.0, [turn(6, 5, None)])))]


def token_logprobs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log pi(o_t | q, o_<t) of each response token, one unpadded row."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


def hand_loss(policy, reference, groups: list[Group], cfg: ZipRLConfig) -> torch.Tensor:
    """-J_ZipRL: -1/Q sum_q 1/G sum_i 1/|o_i| sum_j sum_t (min(rho A_ij, clip(rho) A_ij) - beta KL_t)."""
    lc = cfg.learner
    total = torch.zeros(())
    for group in groups:
        rewards = [t.reward for t in group]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for t in group:
            a_i = (t.reward - mean) / (std + lc.adv_eps)  # Eq. (GRPO advantage)
            scored = [u.q_com for u in t.turns if u.q_com is not None]
            q_bar = sum(scored) / len(scored) if scored else 0.0
            tokens = sum(len(u.response_ids) for u in t.turns)  # |o_i|
            for u in t.turns:
                a_ij = a_i + lc.hrr_weight * (u.q_com - q_bar) if u.q_com is not None else a_i  # Eq. (advantage_adjust)
                logp = token_logprobs(policy, u.prompt_ids, u.response_ids)
                with torch.no_grad():
                    ref = token_logprobs(reference, u.prompt_ids, u.response_ids)
                rho = torch.exp(logp - torch.tensor(u.logprobs))
                m = torch.minimum(rho * a_ij, rho.clamp(1 - lc.clip_eps, 1 + lc.clip_eps) * a_ij)
                kl = torch.exp(ref - logp) - (ref - logp) - 1
                total = total + (m - lc.beta * kl).sum() / (len(groups) * len(group) * tokens)
    return -total


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("micro_batch_turns", [1, 2, 8])
def test_the_step_takes_the_loss_and_gradient_of_the_papers_objective(models, micro_batch_turns, packed):
    """Padded or packed (each micro-batch's rows one unpadded sequence), the step's loss and gradient are the
    objective's."""
    policy, reference = models
    cfg = make_cfg(micro_batch_turns=micro_batch_turns)
    groups = make_groups()
    expected = hand_loss(policy, reference, groups, cfg)
    policy.zero_grad()
    expected.backward()
    want = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()

    learner = TinyLearner(cfg, copy.deepcopy(policy), reference)
    learner.packed = packed
    stats = StepStats(lambda: 0.0)
    update_step(learner, groups, stats)

    assert stats.sums.loss == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    for got, ref in zip(learner.grads, want, strict=True):
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-6)
    assert stats.grad_norm == pytest.approx(float(torch.cat([g.flatten() for g in want]).norm()), rel=1e-4)
    assert learner.policy_version == stats.policy_version == 1
    assert stats.outcome == "trained"
    assert stats.turns == 6
    assert stats.passes == math.ceil(6 / micro_batch_turns)
    assert stats.sums.tokens == 4 + 2 + 3 + 3 + 3 + 5
    assert stats.sums.kl > 0
    assert stats.sums.clipped > 0  # both terms of the objective are exercised
    assert set(stats.dlogp) == {"pos", "neg"}


def test_a_step_without_signal_runs_no_forward_and_still_updates(models):
    """Equal rewards, w = 0, beta = 0: every token's objective is rho * 0, so the gradient is zero without a pass."""
    policy, _ = models
    groups = make_groups()
    for t in (t for g in groups for t in g):
        t.reward = 1.0
    learner = TinyLearner(make_cfg(beta=0.0, hrr_weight=0.0), copy.deepcopy(policy), None)
    stats = StepStats(lambda: 0.0)
    update_step(learner, groups, stats)
    assert stats.outcome == "zero_gradient"
    assert learner.forwards == 0
    assert learner.policy_version == 1
    assert stats.grad_norm == 0.0
    assert stats.metrics()["zero_gradient"] == 1.0


def test_a_batch_whose_groups_are_all_dropped_takes_no_step(models):
    policy, _ = models
    groups = make_groups()
    for t in (t for g in groups for t in g):
        t.reward = 0.0
    learner = TinyLearner(make_cfg(drop_zero_variance_groups=True), copy.deepcopy(policy), None)
    stats = StepStats(lambda: 0.0)
    update_step(learner, groups, stats)
    assert stats.outcome == "skipped"
    assert learner.policy_version == 0
    assert stats.metrics()["skipped"] == 1.0


class PrefixLearner(TinyLearner):
    """Micro-batches as the Trainer plans them on one CPU rank with ``share_prefix``: the step's prefix (the system
    prompt) run once, and each micro-batch running on from it through what its own rows share beyond it (the question);
    ``dtype`` the compute's (bf16: the autocast the Trainer runs on a CPU)."""

    def __init__(self, cfg: ZipRLConfig, policy: torch.nn.Module, lr: float, dtype: torch.dtype | None) -> None:
        super().__init__(cfg, policy, None)
        self.optimizer = torch.optim.SGD(policy.parameters(), lr=lr)
        self.dtype = dtype

    def compute(self) -> contextlib.AbstractContextManager:
        return torch.autocast("cpu", dtype=self.dtype) if self.dtype else contextlib.nullcontext()

    def micro_batches(self, rows):
        n, step = self.cfg.learner.micro_batch_turns, shared_prompt_len(rows)
        groups = [rows[s: s + n] for s in range(0, len(rows), n)]
        batches = [(dataclasses.replace(collate(g, PAD, max(step, shared_prompt_len(g))), packed=self.packed,
                                       share_rows=self.packed), True)
                   for g in groups]
        assert all(mb.prefix_len > step for mb, _ in batches)  # each runs on past the step's prefix
        return batches, torch.tensor([rows[0].input_ids[:step]])


@pytest.fixture(scope="module")
def probe_policy():
    """Wider heads than ``models``' (16 dimensions): bf16 attention over a prefix run in one forward or in two then
    rounds differently, as a real model's does (at 8 dimensions and these lengths it happened not to)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).float()


def probe_groups(same_responses: bool = False) -> list[Group]:
    """Two questions of four single-turn samples, rewards 1, 0, 0, 0 (one positive advantage, three negative): every
    prompt is a 40-token system prompt + a 20-token question, so a micro-batch of one question's turns shares more than
    the step's prefix. ``same_responses``: the samples of a question answer alike (as a low-entropy policy's first
    turns do)."""
    g = torch.Generator().manual_seed(5)

    def ids(n: int) -> list[int]:
        return torch.randint(20, 64, (n,), generator=g).tolist()

    groups, system = [], ids(40)
    for q in ("q1", "q2"):
        prompt, shared = system + ids(20), ids(5)
        groups.append(Group(tuple(
            Trajectory(question_id=q, question=q, answers=["a"], group_id=q, reward=float(i == 0),
                       turns=[Turn(prompt_ids=prompt, response_ids=shared if same_responses else ids(4 + i),
                                   logprobs=[-3.0] * (5 if same_responses else 4 + i), q_com=None)])
            for i in range(4))))
    return groups


def direct_dlogp(before: torch.nn.Module, after: torch.nn.Module, groups: list[Group], sign: str) -> float:
    """The mean change of log pi over the first question's turns' ``sign`` advantage tokens (the probed micro-batch),
    each turn run whole, unpadded."""
    turns = [t.turns[0] for t in groups[0]]
    rewards = [t.reward for t in groups[0]]
    mean = sum(rewards) / len(rewards)
    picked = [u for u, r in zip(turns, rewards, strict=True) if (r > mean if sign == "pos" else r < mean)]
    with torch.no_grad():
        changes = [token_logprobs(after, u.prompt_ids, u.response_ids) - token_logprobs(before, u.prompt_ids,
                                                                                      u.response_ids) for u in picked]
    return float(torch.cat(changes).mean())


def probe_step(policy, lr: float, dtype: torch.dtype | None = None, same_responses: bool = False,
               packed: bool = False):
    groups = probe_groups(same_responses)
    learner = PrefixLearner(make_cfg(beta=0.0, hrr_weight=0.0, micro_batch_turns=4), copy.deepcopy(policy), lr, dtype)
    learner.packed = packed
    stats = StepStats(lambda: 0.0)
    update_step(learner, groups, stats)
    assert stats.outcome == "trained"
    assert stats.probes["pos"].batch is stats.probes["neg"].batch  # the first micro-batch: both signs
    return policy, learner.policy, groups, stats


@pytest.mark.parametrize("packed", [False, True])
def test_the_update_probe_reads_each_signs_change_of_log_pi_through_the_steps_prefix(probe_policy, packed):
    """A micro-batch holding both signs, read through the step's shared prefix (its rows padded or packed): each
    sign's probe is the change of log pi over exactly its own tokens, as the turns run whole before and after the
    update compute it; the step's prefix's gradient reaches the weights from every micro-batch."""
    before, after, groups, stats = probe_step(probe_policy, lr=0.5, packed=packed)
    for sign in ("pos", "neg"):
        assert stats.dlogp[sign] == pytest.approx(direct_dlogp(before, after, groups, sign), abs=1e-5)
    assert abs(stats.dlogp["pos"] - stats.dlogp["neg"]) > 1e-3


def test_the_update_probe_reads_0_without_an_update_in_bf16(probe_policy):
    """No change of weights (lr 0) reads exactly 0: the probe's second forward runs the probed micro-batch the way its
    log-probs before the update were computed (the step's prefix, then the micro-batch's own), not in one forward from
    position 0, whose bf16 round-off differs by ~1e-4 per token (the size of a real step's change)."""
    _, _, _, stats = probe_step(probe_policy, lr=0.0, dtype=torch.bfloat16)
    assert stats.dlogp == {"pos": 0.0, "neg": 0.0}


def test_turns_that_are_the_same_tokens_change_alike_whatever_their_advantages_sign(probe_policy):
    """Why a run can log dlogp_pos_adv == dlogp_neg_adv exactly: the change of log pi of a token depends only on the
    token and its context, not on the advantage it was trained with; when a question's samples open with the same
    turn (a low-entropy policy; micro-batches group turns by prompt, so they share one), the probed micro-batch holds
    one sequence under both signs, and the update moves it by its net advantage, the same for both (to the float32
    round-off of the two means; bf16's coarse log-probs sum exactly, so a bf16 run logs them equal to every digit)."""
    before, after, groups, stats = probe_step(probe_policy, lr=0.5, same_responses=True)
    assert stats.dlogp["pos"] == pytest.approx(stats.dlogp["neg"], rel=1e-6)
    assert stats.dlogp["pos"] == pytest.approx(direct_dlogp(before, after, groups, "pos"), abs=1e-5)


def test_packed_micro_batches_through_the_steps_prefix_take_the_padded_gradient(probe_policy):
    """Micro-batches running on from the step's prefix, packed, leave the gradient the padded ones leave: the rows'
    own tokens and the prefix's backward (carried from every micro-batch into the last) both reach the weights. A
    wide clip keeps every token's ratio unclipped, so every row's tokens carry gradient."""
    grads = {}
    for packed in (False, True):
        learner = PrefixLearner(make_cfg(beta=0.0, hrr_weight=0.2, micro_batch_turns=4, clip_eps=10.0),
                                copy.deepcopy(probe_policy), 0.1, None)
        learner.packed = packed
        stats = StepStats(lambda: 0.0)
        update_step(learner, probe_groups(), stats)
        assert stats.passes == 2
        grads[packed] = learner.grads
    for got, want in zip(grads[True], grads[False], strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads[True])
