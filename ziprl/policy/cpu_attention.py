"""Attention for one-token decode steps of a half-precision model on CPU, as a transformers attention implementation.

With no padding to mask, transformers' SDPA passes no mask and torch takes its CPU flash-attention kernel, which
handles a single bfloat16 query slowly: at 700 cached tokens, batch 8, one thread, SmolLM2-135M's decode step took
238 ms that way, 94 ms with a padding mask (another kernel) and 100 ms with :func:`decode_attention`'s two matmuls.
Unmasked decode steps run those; every other call (prefill, masked steps, training, float32) goes to SDPA as before.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ziprl_cpu_decode"
HALF = (torch.bfloat16, torch.float16)


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``softmax(q k^T * scaling) v`` for one unmasked query per row, grouped-query heads read in place; else SDPA.

    Shapes as transformers passes them: query ``[B, H, 1, D]``, key/value ``[B, H_kv, L, D]``; returns
    ``[B, 1, H, D]``."""
    b, h, q_len, d = query.shape
    h_kv = key.shape[1]
    if (q_len != 1 or attention_mask is not None or dropout or query.device.type != "cpu" or query.dtype not in HALF
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    q = query.reshape(b, h_kv, h // h_kv, d)  # the query heads that share each key/value head
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * (d**-0.5 if scaling is None else scaling)
    out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)  # [B, H_kv, H / H_kv, D]
    return out.reshape(b, 1, h, d), None


def use_decode_attention(model: Any) -> bool:
    """Switch a half-precision CPU model running SDPA to :func:`decode_attention`; whether it was switched."""
    if model.dtype not in HALF or model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
