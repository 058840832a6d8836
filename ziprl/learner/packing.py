"""A micro-batch's rows run as one unpadded sequence (``learner.pack_rows``).

Padded, every row of a micro-batch computes as many tokens as its longest; packed, the rows' own tokens (after the
prefix they share, run once) are laid end to end in one ``[1, L]`` sequence whose attention mask lets each token see
the shared prefix and its own row's earlier tokens, each row at its own positions. Linear layers then compute only
real tokens, while attention compares every token with every packed token; :func:`packing_pays` weighs the two.

Rows also share leading prompt tokens beyond the micro-batch's prefix with an earlier row (GRPO's G samples of one
prompt, a trajectory's turns): those run once, as a prefix tree whose every token sees its ancestors. A row's
response tokens are always its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def pair_cost(config: Any) -> float:
    """FLOPs of attention for one query-key pair over FLOPs of one token through the linear layers of a decoder layer
    (a gated MLP): 4 q / 2 (2 h q + 2 h kv + 3 h i) for hidden size h, query width q, key-value width kv and MLP
    width i."""
    h, i, heads = config.hidden_size, config.intermediate_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    q, kv = heads * head_dim, (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    return 2 * q / (h * (2 * q + 2 * kv + 3 * i))


def packing_pays(lengths: Sequence[int], prefix_len: int, pair: float, packed: int | None = None) -> bool:
    """Whether rows of ``lengths`` tokens (each from column 0, its first ``prefix_len`` shared and run once) cost
    fewer FLOPs packed than padded, in units of one token through the linear layers with ``pair`` (:func:`pair_cost`)
    per query-key pair: padded B T (1 + pair (S + T)) against packed L (1 + pair (S + L)), where T is the longest
    row's own tokens and L the packed tokens (``packed``: :func:`packed_length`; default all rows' own tokens)."""
    own = [n - prefix_len for n in lengths]
    b, t, total = len(own), max(own), sum(own) if packed is None else packed
    return total * (1 + pair * (prefix_len + total)) < b * t * (1 + pair * (prefix_len + t))


def share_plan(input_ids: Tensor, lengths: Sequence[int], prefix_len: int, shareable: Sequence[int] | None
               ) -> list[tuple[int, int]]:
    """For each row k of right-padded ``input_ids`` [B, T]: (j, m), the earlier row j it shares the most leading
    tokens with after column ``prefix_len``, and how many (m), within both rows' first ``shareable`` columns (their
    prompts); (-1, 0) where it shares none, and for every row when ``shareable`` is None."""
    s, plan = prefix_len, [(-1, 0)]
    if shareable is None:
        return plan * len(lengths)
    ids = input_ids[:, s:]
    room = torch.tensor([max(0, min(a, n) - s) for a, n in zip(shareable, lengths, strict=True)], device=ids.device)
    for k in range(1, len(lengths)):
        w = int(room[k])
        same = (ids[:k, :w] == ids[k, :w]).cumprod(1).sum(1).minimum(room[:k]) if w else torch.zeros(1)
        j, m = int(same.argmax()), int(same.max())
        plan.append((j, m) if m else (-1, 0))
    return plan


def packed_length(input_ids: Tensor, lengths: Sequence[int], prefix_len: int, shareable: Sequence[int] | None) -> int:
    """Tokens a packed forward of these rows runs after their prefix (:func:`pack_rows`)."""
    plan = share_plan(input_ids, lengths, prefix_len, shareable)
    return sum(n - prefix_len - m for n, (_, m) in zip(lengths, plan, strict=True))


@dataclass
class PackedRows:
    """The ``[1, L]`` inputs of a packed forward and where each row's tokens sit in it."""

    input_ids: Tensor  # [1, L]: every row's tokens after the prefix that no earlier row holds, in row order
    position_ids: Tensor  # [1, L]: each token's column in its rows
    attention_mask: Tensor  # [1, 1, L, S + L] bool: the prefix and the token's earlier tokens in its rows
    index: Tensor  # [B, T - S]: where row k's column S + c sits in the sequence (0 past the row's end)


def pack_rows(input_ids: Tensor, lengths: Sequence[int], prefix_len: int,
              shareable: Sequence[int] | None = None) -> PackedRows:
    """The rows of right-padded ``input_ids`` [B, T] (row k real up to ``lengths[k]``) packed after their shared
    ``prefix_len`` columns, which a KV cache of one row supplies; a row's leading tokens within its first
    ``shareable`` columns that an earlier row already holds are not repeated (:func:`share_plan`)."""
    device, s = input_ids.device, prefix_len
    plan = share_plan(input_ids, lengths, s, shareable)
    own = [n - s - m for n, (_, m) in zip(lengths, plan, strict=True)]
    index = torch.zeros((len(lengths), input_ids.size(1) - s), dtype=torch.long, device=device)
    start = 0
    for k, (j, m) in enumerate(plan):
        index[k, :m] = index[j, :m]
        index[k, m : lengths[k] - s] = torch.arange(start, start + own[k], device=device)
        start += own[k]
    row = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(own, device=device))
    col = torch.cat([torch.arange(m, n - s, device=device) for n, (_, m) in zip(lengths, plan, strict=True)])
    # token a sees token b when b sits at one of a's row's columns up to a's own
    seen = index.int()[row].gather(1, col[None].expand(len(col), -1)) == torch.arange(len(col), device=device)
    causal = seen & (col[None, :] <= col[:, None])
    mask = torch.cat([causal.new_ones((causal.size(0), s)), causal], 1)
    return PackedRows(input_ids[row, s + col][None], (s + col)[None], mask[None, None], index)
