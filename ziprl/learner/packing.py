"""A micro-batch's rows run as one unpadded sequence (``learner.pack_rows``).

Padded, every row of a micro-batch computes as many tokens as its longest; packed, the rows' own tokens (after the
prefix they share, run once) are laid end to end in one ``[1, L]`` sequence whose attention mask lets each token see
the shared prefix and its own row's earlier tokens, each row at its own positions. Linear layers then compute only
real tokens, while attention compares every token with every packed token; :func:`packing_pays` weighs the two.
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


def packing_pays(lengths: Sequence[int], prefix_len: int, pair: float) -> bool:
    """Whether rows of ``lengths`` tokens (each from column 0, its first ``prefix_len`` shared and run once) cost
    fewer FLOPs packed than padded, in units of one token through the linear layers with ``pair`` (:func:`pair_cost`)
    per query-key pair: padded B T (1 + pair (S + T)) against packed L (1 + pair (S + L)), where T is the longest
    row's own tokens and L all rows' own tokens."""
    own = [n - prefix_len for n in lengths]
    b, t, total = len(own), max(own), sum(own)
    return total * (1 + pair * (prefix_len + total)) < b * t * (1 + pair * (prefix_len + t))


@dataclass
class PackedRows:
    """The ``[1, L]`` inputs of a packed forward and where each row starts in it."""

    input_ids: Tensor  # [1, L]: every row's tokens after the prefix, in row order
    position_ids: Tensor  # [1, L]: each token's column in its own row
    attention_mask: Tensor  # [1, 1, L, S + L] bool: the prefix and the own row's earlier tokens
    offsets: Tensor  # [B]: where each row's column S sits in the sequence


def pack_rows(input_ids: Tensor, lengths: Sequence[int], prefix_len: int) -> PackedRows:
    """The rows of right-padded ``input_ids`` [B, T] (row k real up to ``lengths[k]``) packed after their shared
    ``prefix_len`` columns, which a KV cache of one row supplies."""
    device, s = input_ids.device, prefix_len
    own = torch.tensor([n - s for n in lengths], device=device)
    row = torch.repeat_interleave(torch.arange(len(lengths), device=device), own)
    offsets = torch.cumsum(own, 0) - own
    local = torch.arange(int(own.sum()), device=device) - offsets[row]
    causal = (row[:, None] == row[None, :]) & (local[:, None] >= local[None, :])
    mask = torch.cat([causal.new_ones((causal.size(0), s)), causal], 1)
    return PackedRows(input_ids[row, s + local][None], (s + local)[None], mask[None, None], offsets)
