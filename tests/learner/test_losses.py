"""Token-level losses against hand values and an independent plain-python implementation."""

import math
import random

import pytest
import torch

from ziprl.learner.batch import entropy_from_logits, token_logprobs
from ziprl.learner.losses import token_weight
from ziprl.learner.losses.ppo_clip import clipped_surrogate, k3_kl, policy_loss, truncated_is_weight


def test_token_logprobs_matches_log_softmax_in_chunks():
    torch.manual_seed(0)
    logits, targets = torch.randn(3, 7, 50) * 4, torch.randint(0, 50, (3, 7))
    want = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    for chunk in (1, 5, 1024):
        torch.testing.assert_close(token_logprobs(logits, targets, chunk_rows=chunk), want)
    got = token_logprobs(logits.bfloat16(), targets)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0.1, rtol=0.02)


def test_entropy_from_logits():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 30) * 3
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits, chunk_rows=3), -(p * p.log()).sum(-1))
    # uniform over 30 tokens: H = log 30
    torch.testing.assert_close(entropy_from_logits(torch.zeros(1, 30)), torch.tensor([math.log(30)]))


def test_k3_kl_hand_value_and_nonnegative():
    # logp = log 0.5, ref = log 0.25: d = log 0.5 -> 0.5 - log 0.5 - 1 = log 2 - 0.5
    got = k3_kl(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25)))
    assert float(got) == pytest.approx(math.log(2) - 0.5)
    assert float(k3_kl(torch.tensor(-1.3), torch.tensor(-1.3))) == 0.0
    assert (k3_kl(torch.randn(1000), torch.randn(1000)) >= 0).all()


def test_clipped_surrogate_hand_values():
    eps = 0.2
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])
    # A>0, rho 1.5: min(1.5, 1.2) = 1.2 | A>0, rho 0.5: min(0.5, 0.8) = 0.5
    # A<0, rho 0.5: min(-0.5, -0.8) = -0.8 | A<0, rho 1.5: min(-1.5, -1.2) = -1.5 | in range: 1.1 * 2 = 2.2
    m = clipped_surrogate(ratio.log(), torch.zeros(5), adv, eps)
    torch.testing.assert_close(m, torch.tensor([1.2, 0.5, -0.8, -1.5, 2.2]))


def test_clip_gradients_zero_beyond_clip_region_in_the_right_direction():
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])
    logp = ratio.log().requires_grad_()
    clipped_surrogate(logp, torch.zeros(5), adv, 0.2).sum().backward()
    # d(rho A)/d logp = rho A where unclipped; 0 where the clip is active:
    # A>0 beyond 1+eps -> 0 ; A>0 below 1-eps -> 0.5 ; A<0 below 1-eps -> 0 ; A<0 beyond 1+eps -> -1.5 ; 2.2
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.5, 0.0, -1.5, 2.2]))
    _, stats = policy_loss(ratio.log(), torch.zeros(5), adv, torch.ones(5), torch.ones(5), clip_eps=0.2)
    assert stats["clip_frac"] == pytest.approx(2 / 5)


def reference_objective(trajs, norm, beta, eps):
    """Plain python: trajs = [[(adv, [(logp, old, ref), ...]), ...turns], ...trajectories]."""
    total, n_tokens = 0.0, 0
    for turns in trajs:
        o_i = sum(len(tokens) for _, tokens in turns)
        s = 0.0
        for adv, tokens in turns:
            for lp, old, ref in tokens:
                rho = math.exp(lp - old)
                m = min(rho * adv, min(max(rho, 1 - eps), 1 + eps) * adv)
                kl = math.exp(ref - lp) - (ref - lp) - 1
                s += m - beta * kl
                n_tokens += 1
        total += s / o_i if norm == "trajectory" else s
    return total / len(trajs) if norm == "trajectory" else total / n_tokens


def random_batch(seed):
    """Random trajectories, laid out one turn per row with masked prompt positions and right padding."""
    rng = random.Random(seed)
    trajs = []
    for _ in range(4):
        turns = []
        for _ in range(rng.randint(1, 3)):
            tokens = [
                (rng.uniform(-3, -0.1), rng.uniform(-3, -0.1), rng.uniform(-3, -0.1))
                for _ in range(rng.randint(1, 6))
            ]
            turns.append((rng.uniform(-2, 2), tokens))
        trajs.append(turns)
    rows = [(i, adv, tokens, rng.randint(1, 4)) for i, turns in enumerate(trajs) for adv, tokens in turns]
    width = max(p + len(tokens) for _, _, tokens, p in rows) + 2
    t = {k: torch.full((len(rows), width), 9.0) for k in ("logp", "old", "ref", "adv")}  # garbage off-mask
    mask = torch.zeros(len(rows), width)
    meta = []  # (traj index, row, slice) to fill weights per norm
    for r, (i, adv, tokens, p) in enumerate(rows):
        sl = slice(p, p + len(tokens))
        t["logp"][r, sl], t["old"][r, sl], t["ref"][r, sl] = (
            torch.tensor(x) for x in zip(*tokens, strict=True)
        )
        t["adv"][r, sl] = adv
        mask[r, sl] = 1
        meta.append((i, r, sl))
    return trajs, t, mask, meta


def weights_for(trajs, mask, meta, norm):
    sizes = [sum(len(tok) for _, tok in turns) for turns in trajs]
    w = torch.zeros_like(mask)
    for i, r, sl in meta:
        w[r, sl] = token_weight(sizes[i], len(trajs), sum(sizes), norm)
    return w


@pytest.mark.parametrize("norm", ["trajectory", "token"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_policy_loss_matches_plain_python(norm, beta):
    for seed in range(3):
        trajs, t, mask, meta = random_batch(seed)
        w = weights_for(trajs, mask, meta, norm)
        ref = t["ref"] if beta else None
        loss, stats = policy_loss(t["logp"], t["old"], t["adv"], w, mask, ref, beta=beta, clip_eps=0.2)
        want = -reference_objective(trajs, norm, beta, 0.2)
        assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert stats["tokens"] == float(mask.sum())
        assert ("kl_mean" in stats) == bool(beta)
        # micro-batch exactness at the loss level: summing per-row losses reproduces the batch loss
        parts = [policy_loss(t["logp"][r : r + 1], t["old"][r : r + 1], t["adv"][r : r + 1], w[r : r + 1],
                             mask[r : r + 1], None if ref is None else ref[r : r + 1], beta=beta)[0]
                 for r in range(mask.size(0))]  # fmt: skip
        assert float(sum(parts)) == pytest.approx(float(loss), rel=1e-5, abs=1e-7)


def test_masked_positions_do_not_matter():
    trajs, t, mask, meta = random_batch(7)
    w = weights_for(trajs, mask, meta, "trajectory")
    logp = t["logp"].clone().requires_grad_()
    loss, _ = policy_loss(logp, t["old"], t["adv"], w, mask, t["ref"], beta=0.1)
    loss.backward()
    assert (logp.grad[mask == 0] == 0).all()
    assert (logp.grad[mask == 1] != 0).any()
    off = mask == 0
    perturbed = {k: torch.where(off, v + 3.0, v) for k, v in t.items()}
    loss2, _ = policy_loss(
        perturbed["logp"], perturbed["old"], perturbed["adv"], w, mask, perturbed["ref"], beta=0.1
    )
    assert loss2.item() == loss.item()


def test_beta_without_reference_is_an_error():
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1, 2),
            torch.ones(1, 2),
            torch.ones(1, 2),
            beta=0.1,
        )


def test_token_weight_norms():
    # trajectory: 1 / (G |o_i|) = 1 / (4 * 5) ; token: 1 / N = 1 / 30
    assert token_weight(5, 4, 30, "trajectory") == pytest.approx(1 / 20)
    assert token_weight(5, 4, 30, "token") == pytest.approx(1 / 30)
    with pytest.raises(ValueError, match="norm"):
        token_weight(5, 4, 30, "seq")


def test_tis_weights_are_exactly_one_when_the_engine_is_the_learner():
    logp = torch.tensor([[-0.5, -1.25, -3.0, -0.01]])
    assert torch.equal(truncated_is_weight(logp, logp.clone(), cap=2.0), torch.ones_like(logp))


def test_tis_weights_are_the_truncated_probability_ratio():
    learner = torch.tensor([[-1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.5, -0.5, -3.0]])  # ratios e^0.5, e^-0.5, e^2 (above the cap)
    w = truncated_is_weight(learner, rollout, cap=2.0)
    assert w.tolist()[0] == pytest.approx([math.exp(0.5), math.exp(-0.5), 2.0])


def test_policy_loss_with_tis_is_the_weighted_on_policy_gradient():
    """With the correction on, d loss / d logp_t = -weight_t * w_t * A_t (ratio 1 against the learner's own)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    rollout = torch.tensor([[-1.2, -1.0, -0.5]])
    adv, weight, mask = torch.tensor([[1.0, -2.0, 0.5]]), torch.full((1, 3), 0.25), torch.tensor([[1.0, 1.0, 0.0]])
    loss, st = policy_loss(logp, rollout, adv, weight, mask, tis_cap=2.0)
    loss.backward()
    w = [math.exp(0.2), math.exp(-1.0), 1.0]
    assert logp.grad.tolist()[0] == pytest.approx([-0.25 * w[0] * 1.0, -0.25 * w[1] * -2.0, 0.0])
    assert st["mismatch_abs_mean"] == pytest.approx(0.6)
    assert st["mismatch_abs_max"] == pytest.approx(1.0)
    assert st["tis_mean"] == pytest.approx((w[0] + w[1]) / 2)
    assert st["clip_frac"] == 0.0
