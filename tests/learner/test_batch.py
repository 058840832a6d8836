"""Turn rows, micro-batches and response log-probs, with a tiny random Llama."""

import copy
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from ziprl.config import LearnerConfig
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.learner.advantages import compute_advantages
from ziprl.learner.batch import (
    TurnRow,
    build_rows,
    collate,
    make_micro_batches,
    micro_batch_bounds,
    plan_micro_batches,
    response_logprobs,
    response_logprobs_and_entropy,
    shared_prompt_len,
)
from ziprl.learner.losses.ppo_clip import policy_loss

PAD = 0


def collate_rows(rows, share: bool):
    """``rows`` as one micro-batch; with ``share`` the prompt tokens they all share run once."""
    return collate(rows, PAD, shared_prompt_len(rows) if share else 0)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)  # fmt: skip
    return LlamaForCausalLM(cfg).float().eval()


def turn(prompt, response, q=None, logprobs=None):
    lp = [-1.0 - 0.1 * k for k in range(len(response))] if logprobs is None else logprobs
    return Turn(prompt_ids=list(prompt), response_ids=list(response), logprobs=lp, q_com=q)


def traj(group, reward, turns):
    return Trajectory(
        question_id=group, question="q", answers=["a"], group_id=group, reward=reward, turns=turns
    )


def test_rows_layout_and_weights():
    a = traj("g", 1.0, [turn([1, 2, 3], [4, 5]), turn([1, 2, 3, 4, 5, 6], [7, 8, 9])])  # |o_a| = 5
    b = traj("g", 0.0, [turn([1, 2], [10, 11, 12, 13]), turn([3], [])])  # |o_b| = 4; empty turn -> no row
    rows = build_rows([a, b], [[0.5, 0.7], [-1.0, -1.0]], norm="trajectory")
    assert [r.input_ids for r in rows] == [
        [1, 2, 3, 4, 5],
        [1, 2, 3, 4, 5, 6, 7, 8, 9],
        [1, 2, 10, 11, 12, 13],
    ]
    assert [r.response_start for r in rows] == [3, 6, 2]
    assert [r.advantage for r in rows] == [0.5, 0.7, -1.0]
    # trajectory norm: 1 / (G |o_i|) = 1 / (2 * 5) for a, 1 / (2 * 4) for b
    assert [r.weight for r in rows] == pytest.approx([0.1, 0.1, 0.125])
    # token norm: 1 / N = 1 / 9 everywhere
    assert [r.weight for r in build_rows([a, b], [[0.5, 0.7], [-1.0, -1.0]], "token")] == pytest.approx(
        [1 / 9] * 3
    )

    (mb,) = make_micro_batches(rows, micro_batch_size=8, pad_id=PAD)  # every row from column 0, right-padded
    assert mb.input_ids.shape == (3, 9)
    assert mb.input_ids[0].tolist() == [1, 2, 3, 4, 5, PAD, PAD, PAD, PAD]
    assert mb.attention_mask[0].tolist() == [1] * 5 + [0] * 4
    assert mb.response_starts == (3, 6, 2)
    assert mb.response_ends == (5, 9, 6)
    assert mb.loss_mask[0].tolist() == [0] * 3 + [1, 1] + [0] * 4  # exactly the response tokens
    assert mb.loss_mask[2].tolist() == [0] * 2 + [1] * 4 + [0] * 3
    assert mb.old_logp[0, 3:5].tolist() == pytest.approx([-1.0, -1.1])
    assert mb.old_logp[0, :3].eq(0).all()
    assert mb.adv[1].tolist() == pytest.approx([0] * 6 + [0.7] * 3)
    assert mb.weight[2].tolist() == pytest.approx([0] * 2 + [0.125] * 4 + [0] * 3)
    assert [m.input_ids.shape for m in make_micro_batches(rows, 2, PAD)] == [(2, 9), (1, 6)]


def test_truncation_drops_leftmost_prompt_tokens_only():
    t = traj("g", 1.0, [turn([1, 2, 3, 4, 5, 6], [7, 8, 9])])
    (row,) = build_rows([t], [[1.0]], "trajectory", max_seq_len=5)
    assert row.input_ids == [5, 6, 7, 8, 9]
    assert row.response_start == 2
    assert row.truncated == 4
    (row,) = build_rows([t], [[1.0]], "trajectory", max_seq_len=4)  # one prompt token left
    assert row.input_ids == [6, 7, 8, 9]
    assert row.truncated == 5
    with pytest.raises(ValueError, match="never truncated"):
        build_rows([t], [[1.0]], "trajectory", max_seq_len=3)
    (row,) = build_rows([t], [[1.0]], "trajectory", max_seq_len=9)
    assert row.truncated == 0
    assert len(row.input_ids) == 9


def test_row_errors():
    with pytest.raises(ValueError, match="logprobs"):
        build_rows([traj("g", 1.0, [turn([1], [2, 3], logprobs=[-1.0])])], [[1.0]], "token")
    with pytest.raises(ValueError, match="advantages"):
        build_rows([traj("g", 1.0, [turn([1], [2])])], [[1.0, 2.0]], "token")
    with pytest.raises(ValueError, match="empty prompt"):
        build_rows([traj("g", 1.0, [turn([], [2])])], [[1.0]], "token")


def sample_trajectories():
    """Two groups of two (g1, then g2)."""
    g = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(1, 64, (n,), generator=g).tolist()

    return [
        traj("g1", 1.0, [turn(ids(5), ids(3), q=0.9), turn(ids(9), ids(4), q=0.3), turn(ids(12), ids(2))]),
        traj("g1", 0.0, [turn(ids(4), ids(6), q=0.5), turn(ids(10), ids(1), q=0.6)]),
        traj("g2", 1.0, [turn(ids(7), ids(5), q=0.2)]),
        traj("g2", 0.0, [turn(ids(3), ids(2)), turn(ids(8), ids(3), q=0.8), turn(ids(11), ids(4), q=0.1)]),
    ]


def direct_logprobs(model, row, temperature=1.0):
    """Unpadded single-row forward, full log-softmax: log p of each response token."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([row.input_ids])).logits[0] / temperature
    lp = torch.log_softmax(logits, -1)
    s = row.response_start
    return [float(lp[t - 1, row.input_ids[t]]) for t in range(s, len(row.input_ids))]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_unpadded_forward(model, temperature):
    rows = build_rows(sample_trajectories(), [[0.0] * 3, [0.0] * 2, [0.0], [0.0] * 3], "trajectory")
    for mb in make_micro_batches(rows, 3, PAD):
        with torch.no_grad():
            logp = response_logprobs(model, mb, temperature)
        assert logp.shape == mb.input_ids.shape
        assert (logp[mb.loss_mask == 0] == 0).all()
    (whole,) = make_micro_batches(rows, len(rows), PAD)
    with torch.no_grad():
        batched = response_logprobs(model, whole, temperature)
    for k, row in enumerate(rows):
        got = batched[k][whole.loss_mask[k] == 1].tolist()
        assert got == pytest.approx(direct_logprobs(model, row, temperature), abs=1e-5)


def test_entropy_matches_direct(model):
    (row,) = build_rows([traj("g", 1.0, [turn([3, 4, 5], [6, 7])])], [[1.0]], "token")
    (mb,) = make_micro_batches([row], 1, PAD)
    with torch.no_grad():
        logp, ent = response_logprobs_and_entropy(model, mb)
        p = torch.softmax(model(input_ids=mb.input_ids).logits[0], -1)
    want = -(p * p.log()).sum(-1)[2:4]  # positions 2, 3 predict response tokens 3, 4
    torch.testing.assert_close(ent[0, 3:5], want, atol=1e-5, rtol=1e-5)
    assert ent[0, :3].eq(0).all()
    assert logp[0, :3].eq(0).all()


def keep_head_input(model):
    """Keep the hidden states the LM head is handed (every position, before the response columns are gathered) with
    their gradient; returns (kept list, hook handle)."""
    kept = []

    def hook(_, args):
        args[0].retain_grad()
        kept.append(args[0])
    return kept, model.lm_head.register_forward_pre_hook(hook)


def loss_of(model, mb, beta=0.0):
    logp = response_logprobs(model, mb)
    ref = logp.detach() - 0.05 if beta else None
    return policy_loss(logp, mb.old_logp, mb.adv, mb.weight, mb.loss_mask, ref, beta=beta, clip_eps=0.2)[0]


def test_gradients_reach_only_response_positions(model):
    trajs = sample_trajectories()
    res = compute_advantages([Group(tuple(trajs[:2])), Group(tuple(trajs[2:]))], LearnerConfig(hrr_weight=0.2))
    (mb,) = make_micro_batches(build_rows(res.trajectories, res.turn_advantages, "trajectory"), 16, PAD)
    kept, handle = keep_head_input(model)
    try:
        loss_of(model, mb, beta=0.1).backward()
    finally:
        handle.remove()
    # the hidden state at t-1 scores token t: it gets gradient iff token t is a response token
    predicts_response = torch.zeros_like(mb.loss_mask, dtype=torch.bool)
    predicts_response[:, :-1] = mb.loss_mask[:, 1:].bool()
    grad_norm = kept[0].grad.abs().sum(-1)
    assert (grad_norm[~predicts_response] == 0).all()
    assert (grad_norm[predicts_response] > 0).all()
    model.zero_grad()
    # values at prompt / padding positions never enter the loss
    off = mb.loss_mask == 0
    with torch.no_grad():
        base = loss_of(model, mb)
        mb.old_logp[off], mb.adv[off], mb.weight[off] = 5.0, -7.0, 3.0
        assert loss_of(model, mb).item() == base.item()


def grads_after(model, micro_batches):
    """Accumulate gradients over micro-batches (plain sum of losses, no division)."""
    model.zero_grad()
    total = 0.0
    for mb in micro_batches:
        loss = loss_of(model, mb, beta=0.1)
        loss.backward()
        total += loss.item()
    return total, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("norm", ["trajectory", "token"])
def test_gradient_accumulation_is_exact(model, norm):
    trajs = sample_trajectories()
    res = compute_advantages([Group(tuple(trajs[:2])), Group(tuple(trajs[2:]))], LearnerConfig(hrr_weight=0.2))
    rows = build_rows(res.trajectories, res.turn_advantages, norm)
    # behaviour log-probs off the current policy so that some ratios clip
    for row, mb in zip(rows, (make_micro_batches([r], 1, PAD)[0] for r in rows), strict=True):
        with torch.no_grad():
            cur = response_logprobs(model, mb)[0, row.response_start :]
        row.old_logp = (
            cur + 0.3 * torch.randn(cur.shape, generator=torch.Generator().manual_seed(2))
        ).tolist()
    full_loss, full_grads = grads_after(model, make_micro_batches(rows, len(rows), PAD))
    for size, order in ((1, rows), (3, rows), (4, rows[::-1])):
        loss, grads = grads_after(model, make_micro_batches(order, size, PAD))
        assert loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
        for g, f in zip(grads, full_grads, strict=True):
            torch.testing.assert_close(g, f, atol=1e-6, rtol=1e-4)
    model.zero_grad()


def test_hrr_term_pushes_higher_quality_turn_up_more(model):
    # one zero-variance group (both rewards 0): A_GRPO = 0, so A_ij = w (Q_ij - Q_bar) = 0.2 * (+-0.4)
    t1 = traj("g", 0.0, [turn([5, 6, 7], [8, 9, 10], q=0.9), turn([5, 6, 7], [8, 9, 10], q=0.1)])
    t2 = traj("g", 0.0, [turn([11, 12], [13, 14])])
    res = compute_advantages([Group((t1, t2))], LearnerConfig(hrr_weight=0.2))
    assert res.turn_advantages[0] == pytest.approx([0.08, -0.08])
    rows = build_rows(res.trajectories, res.turn_advantages, "trajectory")
    (mb,) = make_micro_batches(rows, 8, PAD)
    with torch.no_grad():
        logp = response_logprobs(model, mb)
    leaf = logp.clone().requires_grad_()
    policy_loss(leaf, logp, mb.adv, mb.weight, mb.loss_mask)[0].backward()
    # on-policy: d loss / d logp_t = -weight * A ; high-Q turn descends to higher log-prob
    g_high, g_low = leaf.grad[0, 3:6], leaf.grad[1, 3:6]
    assert (g_high < 0).all()
    assert (g_low > 0).all()
    torch.testing.assert_close(g_high, torch.full((3,), -0.08 / (2 * 6)))
    # one SGD step on each turn alone moves its log-prob in the direction of its advantage
    for k, sign in ((0, 1.0), (1, -1.0)):
        m = copy.deepcopy(model)
        (one,) = make_micro_batches([rows[k]], 1, PAD)
        one.old_logp = response_logprobs(m, one).detach()
        loss_of(m, one).backward()
        before = one.old_logp.sum().item()
        with torch.no_grad():
            for p in m.parameters():
                p -= 1.0 * p.grad
            after = response_logprobs(m, one).sum().item()
        assert sign * (after - before) > 0


def test_logits_kept_do_not_grow_with_prompt_spread(model):
    # Regression (scale_sim): right-padded rows kept logits from the shortest prompt on, i.e. [B, T - min_start, V];
    # at micro_batch_turns=128 that was 5 GB per learner rank. Only response-scoring positions may be kept.
    short = traj("g", 1.0, [turn([1, 2, 3], [4, 5])])
    long = traj("g", 0.0, [turn(list(range(1, 61)), [7, 8, 9])])
    rows = build_rows([short, long], [[1.0], [-1.0]], "trajectory")
    (mb,) = make_micro_batches(rows, 2, PAD)
    shapes = []
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: shapes.append(tuple(out.shape)))
    try:
        with torch.no_grad():
            logp = response_logprobs(model, mb)
    finally:
        hook.remove()
    assert shapes == [(1, 2 + 3, model.config.vocab_size)]  # the response tokens' columns, not 60 + 3 a row
    for k, row in enumerate(rows):
        assert logp[k][mb.loss_mask[k] == 1].tolist() == pytest.approx(direct_logprobs(model, row), abs=1e-5)


@pytest.mark.parametrize("share", [False, True])
def test_the_lm_head_reads_a_contiguous_batch(model, share):
    """Regression (vs_trl profile): kept positions asked for as ``logits_to_keep=n`` reach the LM head as a strided
    view of the batch, on which torch's CPU linear copies a frozen head's weight once per row (the bf16 reference
    forward took 1.6 s instead of 0.8 s). The positions scoring response tokens are gathered into a contiguous
    [1, N, H] before the head (N the batch's response tokens: a shorter response computes no padding there)."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    trajs = [traj("g", 1.0, [turn([1, 2, 3, 4, 5], [6, 7])]), traj("g", 0.0, [turn([1, 2, 3, 9], [8, 9, 10])])]
    try:
        with torch.no_grad():
            response_logprobs(model, collate_rows(build_rows(trajs, [[1.0], [-1.0]], "trajectory"), share))
    finally:
        hook.remove()
    assert [tuple(h.shape) for h in seen if h.size(1) > 1] == [(1, 2 + 3, 64)]
    assert all(h.is_contiguous() for h in seen)


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_loss_mask_shifted_against_the_responses_is_refused(shift):
    """Left: the mask covers the last prompt token (and drops each turn's last token); right: it covers padding.
    Either is refused where the micro-batch is built, before any loss is computed (the learning gate's mutation)."""
    a = traj("g", 1.0, [turn([1, 2, 3], [4, 5])])
    b = traj("g", 0.0, [turn([1, 2], [10, 11, 12, 13])])
    (mb,) = make_micro_batches(build_rows([a, b], [[1.0], [-1.0]], "trajectory"), 8, PAD)
    mask = torch.roll(mb.loss_mask, shift, dims=1)
    with pytest.raises(ValueError, match="loss mask covers a (prompt|padding) token"):
        dataclasses.replace(mb, loss_mask=mask)
    assert dataclasses.replace(mb, adv=-mb.adv).loss_mask.equal(mb.loss_mask)  # other edits keep a valid batch


def test_shared_prefix_layout_and_length():
    """The rows' common leading tokens fill columns 0..S-1 of every row; S leaves every row one prompt token of its
    own, and one row shares nothing."""
    from ziprl.learner.batch import computed_tokens
    from ziprl.policy.kv import shared_prefix_len

    a = traj("g", 1.0, [turn([1, 2, 3, 4], [5, 6])])
    b = traj("g", 0.0, [turn([1, 2, 3, 9, 9, 9], [7])])
    rows = build_rows([a, b], [[1.0], [-1.0]], "trajectory")
    prompts = [r.input_ids[: r.response_start] for r in rows]
    assert shared_prefix_len(prompts) == 3
    assert shared_prefix_len(prompts[:1]) == 0
    same = build_rows([a, a], [[1.0], [1.0]], "trajectory")
    assert shared_prefix_len([r.input_ids[: r.response_start] for r in same]) == 3  # identical: all but the last
    mb = collate_rows(rows, True)
    assert mb.prefix_len == 3
    assert mb.response_starts == (4, 6)
    assert mb.input_ids[0].tolist() == [1, 2, 3, 4, 5, 6, PAD]
    assert mb.input_ids[1].tolist() == [1, 2, 3, 9, 9, 9, 7]
    assert mb.loss_mask[0].tolist() == [0] * 4 + [1, 1, 0]
    assert mb.loss_mask[1].tolist() == [0] * 6 + [1]
    assert computed_tokens(mb) == 3 + (3 + 4)  # the prefix once, each row's own tokens
    assert collate(rows, PAD).prefix_len == 0
    # a prefix shared wider than these rows (a step's): a shorter one, even over one row, but never past a row's
    # prompt or over tokens the rows do not share
    assert collate(rows, PAD, 2).prefix_len == 2
    assert collate(rows[:1], PAD, 3).prefix_len == 3
    for bad, over in ((4, rows), (4, rows[:1])):
        with pytest.raises(ValueError, match=f"prefix_len {bad}"):
            collate(over, PAD, bad)


@pytest.mark.parametrize("cache_kw", ["cache", "past_key_values"])
def test_shared_prefix_gives_the_unshared_logprobs_and_gradients(model, cache_kw, monkeypatch):
    """Running the common prefix once (its keys and values repeated over the rows) changes neither the response
    log-probs nor the gradient of the loss, under either spelling of the KV-cache argument."""
    from ziprl.policy import kv

    monkeypatch.setattr(kv, "cache_kwarg", lambda m: cache_kw)
    monkeypatch.setattr("ziprl.learner.batch.cache_kwarg", lambda m: cache_kw)
    g = torch.Generator().manual_seed(1)
    system = torch.randint(1, 64, (20,), generator=g).tolist()
    trajs = [traj("g", float(k % 2), [turn(system + torch.randint(1, 64, (3 + 2 * k,), generator=g).tolist(),
                                           torch.randint(1, 64, (2 + k,), generator=g).tolist())]) for k in range(4)]
    rows = build_rows(trajs, [[1.0], [-1.0], [0.5], [-0.5]], "trajectory")
    results = {}
    for share in (False, True):
        mb = collate_rows(rows, share)
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, mb)
        loss, _ = policy_loss(logp, mb.old_logp, mb.adv, mb.weight, mb.loss_mask)
        loss.backward()
        results[share] = (logp[mb.loss_mask.bool()].detach(), [p.grad.clone() for p in model.parameters()])
    assert collate_rows(rows, True).prefix_len == 20
    assert results[True][0].tolist() == pytest.approx(results[False][0].tolist(), abs=1e-5)
    for shared, plain in zip(results[True][1], results[False][1], strict=True):
        assert torch.allclose(shared, plain, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("share", [False, True])
def test_padded_rows_run_without_an_attention_mask(model, share):
    """Regression (H100 profile): left-padded prompts made every micro-batch carry a padding mask, which sends
    attention to a masked kernel (Qwen3-1.7B learner: 10.0k tokens/s with prompts of unequal length, 18.5k with equal
    ones). Rows start at column 0 and pad on the right, so the rows' forward gets no mask and every row still gets its
    unpadded log-probs."""
    system = [11, 12, 13, 14]
    trajs = [traj("g", 1.0, [turn(system + [5, 6, 7, 8, 9], [20, 21])]),
             traj("g", 0.0, [turn(system + [3], [22, 23, 24, 25])]),
             traj("g", 1.0, [turn(system + [7, 7], [26])])]
    rows = build_rows(trajs, [[1.0], [-1.0], [0.5]], "trajectory")
    mb = collate_rows(rows, share)
    assert mb.attention_mask.eq(0).any()
    assert mb.prefix_len == (4 if share else 0)  # the batch is padded
    calls = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(kwargs), with_kwargs=True)
    try:
        with torch.no_grad():
            logp = response_logprobs(model, mb)
    finally:
        hook.remove()
    assert len(calls) == (2 if share else 1)
    assert calls[-1].get("attention_mask") is None
    for k, row in enumerate(rows):
        assert logp[k][mb.loss_mask[k] == 1].tolist() == pytest.approx(direct_logprobs(model, row), abs=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 6)), min_size=1, max_size=5),
       system=st.integers(0, 6), share=st.booleans(), seed=st.integers(0, 2**16))
def test_any_rows_get_their_unpadded_logprobs(model, shapes, system, share, seed):
    """Rows of any prompt and response lengths, with or without a common system prefix run once: every response token's
    log-prob is the one an unpadded single-row forward gives it, and nothing outside the responses is scored."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(1, 64, (system,), generator=g).tolist()
    trajs = [traj("g", 1.0, [turn(head + torch.randint(1, 64, (p,), generator=g).tolist(),
                                  torch.randint(1, 64, (r,), generator=g).tolist())]) for p, r in shapes]
    rows = build_rows(trajs, [[1.0]] * len(trajs), "trajectory")
    mb = collate_rows(rows, share)
    with torch.no_grad():
        logp = response_logprobs(model, mb)
    assert logp[mb.loss_mask == 0].eq(0).all()
    for k, row in enumerate(rows):
        assert logp[k][mb.loss_mask[k] == 1].tolist() == pytest.approx(direct_logprobs(model, row), abs=1e-5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=60), st.integers(1, 9), st.integers(0, 20000))
def test_micro_batch_bounds_cover_every_row_once_within_the_budget(lengths, size, max_tokens):
    lengths = sorted(lengths)
    bounds = micro_batch_bounds(lengths, size, max_tokens)
    assert [i for s, e in bounds for i in range(s, e)] == list(range(len(lengths)))  # in order, each once
    for k, (s, e) in enumerate(bounds):
        assert e > s
        if not max_tokens:
            assert e - s == size or (k == len(bounds) - 1 and e - s <= size)
            continue
        assert e - s == 1 or (e - s) * max(lengths[s:e]) <= max_tokens  # a longer turn runs alone
        if e < len(lengths):  # greedy: the next row would not have fitted
            assert (e + 1 - s) * max(lengths[s : e + 1]) > max_tokens


def test_micro_batch_bounds_refuse_a_bad_size():
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        micro_batch_bounds([3, 4], 0)
    with pytest.raises(ValueError, match="max_tokens >= 0"):
        micro_batch_bounds([3, 4], 2, -1)


def _plan_cost(rows, groups) -> int:
    """Tokens the plan's micro-batches compute: each its rows' shared prefix once, every row padded to its longest."""
    from ziprl.policy.kv import shared_prefix_len

    total = 0
    for group in groups:
        m = shared_prefix_len([rows[i].input_ids[: rows[i].response_start] for i in group])
        total += m + len(group) * (max(len(rows[i].input_ids) for i in group) - m)
    return total


def test_the_plan_puts_the_turns_of_a_trajectory_together():
    """A trajectory's turn extends the one before (its prompt is the last prompt, response and observation): the
    plan puts each trajectory's turns in micro-batches of their own, which then share most of their prompts (here
    the question's first 40-token passage), where the length order mixes the two trajectories."""
    system = list(range(1, 31))
    rows = []
    for question in (40, 41):
        prompt = [*system, question, question, *[question + 30] * 40]
        for k in range(4):
            response = [50 + k] * 6
            rows.append(TurnRow(prompt + response, len(prompt), [-1.0] * 6, 1.0, 0.1, question))
            prompt = prompt + response + [60 + k] * 3  # the next turn: this one's response and an observation
    shuffled = [rows[i] for i in (5, 0, 7, 2, 4, 1, 6, 3)]
    groups = plan_micro_batches(shuffled, size=4)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert sorted(sorted(shuffled[i].traj_index for i in g) for g in groups) == [[40] * 4, [41] * 4]
    by_length = [list(range(k, k + 4)) for k in (0, 4)]  # the order micro_batch_bounds cuts: by length
    ordered = sorted(range(8), key=lambda i: len(shuffled[i].input_ids))
    assert _plan_cost(shuffled, groups) < _plan_cost(shuffled, [[ordered[i] for i in g] for g in by_length])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 4), min_size=1, max_size=12), st.integers(1, 6)), max_size=24),
       st.integers(1, 6), st.sampled_from([0, 10, 40]))
def test_the_plan_covers_every_row_once_within_the_budget(shapes, size, max_tokens):
    """Any prompts: every row in one micro-batch, at most ``size`` rows (or rows x longest <= ``max_tokens``) in each,
    and never more tokens computed than one micro-batch per row."""
    rows = [TurnRow(p + [9] * n, len(p), [-1.0] * n, 1.0, 1.0, k) for k, (p, n) in enumerate(shapes)]
    groups = plan_micro_batches(rows, size, max_tokens)
    assert sorted(i for g in groups for i in g) == list(range(len(rows)))
    for g in groups:
        longest = max(len(rows[i].input_ids) for i in g)
        assert len(g) == 1 or (len(g) * longest <= max_tokens if max_tokens else len(g) <= size)
    assert _plan_cost(rows, groups) + 64 * len(groups) <= sum(len(r.input_ids) + 64 for r in rows)


def test_the_plan_refuses_a_bad_size():
    with pytest.raises(ValueError, match="size must be >= 1"):
        plan_micro_batches([], 0)
