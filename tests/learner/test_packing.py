"""Packed rows (ziprl.learner.packing): the cost model, the layout, and the log-probs a packed forward gives."""

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from ziprl.learner.batch import TurnRow, collate, response_logprobs, shared_prompt_len
from ziprl.learner.packing import pack_rows, packed_length, packing_pays, pair_cost, share_plan

PAD = 0
SMOLLM2_135M = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                           head_dim=64)


def test_a_pair_costs_attentions_share_of_a_tokens_linear_flops():
    """SmolLM2-135M: 4 x 576 FLOPs a query-key pair against 2 (2 x 576^2 + 2 x 576 x 192 + 3 x 576 x 1536) a
    token: 1 / 3072."""
    assert pair_cost(SMOLLM2_135M) == pytest.approx(1 / 3072)
    mha = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4)
    assert pair_cost(mha) == pytest.approx(2 * 64 / (64 * (2 * 64 + 2 * 64 + 3 * 128)))


@pytest.mark.parametrize(("lengths", "prefix", "pays"), [
    ([40, 40, 40, 40], 10, False),  # no padding: packing only widens attention
    ([60, 75, 75, 75, 45, 45, 70, 75], 35, True),  # vs_trl's shape: ~20% padding
    ([80], 0, False),  # one row pads nothing
    ([900, 900, 900, 700], 700, True),  # a turn's rows after a long shared prompt
    ([4000, 4000, 4000, 3900], 0, False),  # long rows: packed attention costs more than 2.5% padding
])
def test_packing_pays_where_the_padding_outweighs_the_wider_attention(lengths, prefix, pays):
    assert packing_pays(lengths, prefix, pair_cost(SMOLLM2_135M)) is pays


def test_the_packed_layout():
    ids = torch.tensor([[7, 8, 1, 2, 3], [7, 8, 4, PAD, PAD], [7, 8, 5, 6, PAD]])
    rows = pack_rows(ids, [5, 3, 4], 2)
    assert rows.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert rows.position_ids.tolist() == [[2, 3, 4, 2, 2, 3]]  # each row's own columns
    mask = rows.attention_mask[0, 0].int().tolist()
    assert mask == [[1, 1, 1, 0, 0, 0, 0, 0],  # the prefix, then itself and its own row's earlier tokens
                    [1, 1, 1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0, 0],
                    [1, 1, 0, 0, 0, 1, 0, 0],
                    [1, 1, 0, 0, 0, 0, 1, 0],
                    [1, 1, 0, 0, 0, 0, 1, 1]]
    assert rows.index.tolist() == [[0, 1, 2], [3, 0, 0], [4, 5, 0]]


def test_rows_share_the_prompt_tokens_an_earlier_row_holds():
    """A prefix tree: rows 1 and 2 repeat row 0's prompt (GRPO's samples of one prompt), row 3 shares two of its
    columns; each token sees the prefix and its ancestors, each response is its own, and nothing is shared past a
    row's prompt (row 2's response repeats row 0's)."""
    ids = torch.tensor([[7, 1, 2, 3, 4, PAD], [7, 1, 2, 3, 5, 6], [7, 1, 2, 3, 4, PAD], [7, 1, 2, 9, 8, PAD]])
    lengths, starts = [5, 6, 5, 5], [4, 4, 4, 4]  # prompts [7, 1, 2, 3] x 3 and [7, 1, 2, 9]
    assert share_plan(ids, lengths, 1, starts) == [(-1, 0), (0, 3), (0, 3), (0, 2)]
    assert share_plan(ids, lengths, 1, None) == [(-1, 0)] * 4
    rows = pack_rows(ids, lengths, 1, starts)
    assert rows.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 4, 9, 8]]
    assert rows.position_ids.tolist() == [[1, 2, 3, 4, 4, 5, 4, 3, 4]]
    assert rows.index.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 4, 5], [0, 1, 2, 6, 0], [0, 1, 7, 8, 0]]
    assert rows.attention_mask[0, 0].int().tolist() == [
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],  # row 0's response
        [1, 1, 1, 1, 0, 1, 0, 0, 0, 0],  # row 1's response, after the shared prompt
        [1, 1, 1, 1, 0, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 1, 0, 0],  # row 2's response
        [1, 1, 1, 0, 0, 0, 0, 0, 1, 0],  # row 3's own prompt token, after the two it shares
        [1, 1, 1, 0, 0, 0, 0, 0, 1, 1]]
    assert packed_length(ids, lengths, 1, starts) == 9
    assert packed_length(ids, lengths, 1, None) == 4 + 5 + 4 + 4


def test_packing_pays_counts_the_tokens_a_prefix_tree_saves():
    """vs_trl's shape: 8 rows of 2 prompts x G = 4 (24 template tokens shared, ~18 own prompt tokens, ~24 response
    tokens): packed without the tree 340 tokens, with it 229."""
    lengths, prefix = [66] * 8, 24
    assert packing_pays(lengths, prefix, pair_cost(SMOLLM2_135M)) is False  # no padding: no gain from packing alone
    assert packing_pays(lengths, prefix, pair_cost(SMOLLM2_135M), packed=2 * 18 + 8 * 24) is True


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).float().eval()


def direct_logprobs(model, row):
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([row.input_ids])).logits[0], -1)
    return [float(lp[t - 1, row.input_ids[t]]) for t in range(row.response_start, len(row.input_ids))]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 6), st.integers(-1, 4), st.integers(0, 12)),
                       min_size=1, max_size=6),
       system=st.integers(0, 6), share=st.booleans(), seed=st.integers(0, 2**16))
def test_packed_rows_get_their_unpadded_logprobs(model, shapes, system, share, seed):
    """Rows of any lengths, packed after the prefix they share (or from column 0), some repeating the leading prompt
    tokens (or the whole prompt) of an earlier row: every response token's log-prob is an unpadded single-row
    forward's, and nothing outside the responses is scored."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(1, 64, (system,), generator=g).tolist()
    rows, prompts = [], []
    for p, r, source, keep in shapes:  # source: an earlier row whose first `keep` prompt tokens this one starts with
        start = prompts[source % len(prompts)][len(head):][:keep] if source >= 0 and prompts else []
        prompt = head + start + torch.randint(1, 64, (p,), generator=g).tolist()[: p - (len(start) > 0) * p // 2]
        if start and keep == 12:  # the same prompt again (another sample of it)
            prompt = prompts[source % len(prompts)]
        prompts.append(prompt)
        rows.append(TurnRow(prompt + torch.randint(1, 64, (r,), generator=g).tolist(), len(prompt), [0.0] * r, 1.0,
                            1.0, 0))
    mb = dataclasses.replace(collate(rows, PAD, shared_prompt_len(rows) if share else 0), packed=True, share_rows=True)
    with torch.no_grad():
        logp = response_logprobs(model, mb)
    assert logp.shape == mb.input_ids.shape
    assert logp[mb.loss_mask == 0].eq(0).all()
    for k, row in enumerate(rows):
        assert logp[k][mb.loss_mask[k] == 1].tolist() == pytest.approx(direct_logprobs(model, row), abs=1e-5)
