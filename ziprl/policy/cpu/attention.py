"""Attention for one-token decode steps of a half-precision model on CPU, as a transformers attention implementation.

torch's SDPA handles a single bfloat16 query slowly on CPU: unmasked it takes its flash-attention kernel (at 700
cached tokens, batch 8, one thread, SmolLM2-135M's decode step took 238 ms that way, 100 ms with
:func:`decode_attention`'s two matmuls), and with a padding mask, as every batch of unequal prompts has, the flash
kernel took 606 us a layer at batch 2 and ~650 cached tokens, against 147 us here. Decode steps run those two matmuls
over the cache's whole buffer (:func:`tight`); every other call (prefill, training, float32) goes to SDPA as before.
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
    """``softmax(q k^T * scaling + mask) v`` for one query per row, grouped-query heads read in place; else SDPA.

    Shapes as transformers passes them: query ``[B, H, 1, D]``, key/value ``[B, H_kv, L, D]``, the mask boolean
    (True: attend) or additive, broadcasting to ``[B, 1, 1, L]``; returns ``[B, 1, H, D]``."""
    b, h, q_len, d = query.shape
    h_kv, n = key.shape[1], key.shape[-2]
    if (q_len != 1 or dropout or query.device.type != "cpu" or query.dtype not in HALF
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    key, value = tight(key), tight(value)
    q = query.reshape(b, h_kv, h // h_kv, d)  # the query heads that share each key/value head
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * (d**-0.5 if scaling is None else scaling)
    scores[..., n:] = float("-inf")  # the buffer's room past the cache
    if attention_mask is not None:
        mask = attention_mask[..., -n:]
        if mask.dtype == torch.bool:
            scores[..., :n].masked_fill_(~mask, float("-inf"))
        else:
            scores[..., :n] += mask
    out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)  # [B, H_kv, H / H_kv, D]
    return out.reshape(b, 1, h, d), None


def tight(t: torch.Tensor) -> torch.Tensor:
    """``t`` (``[B, H, L, D]``) widened to the contiguous ``[B, H, capacity, D]`` buffer it is the front of, when its
    strides say it is one (a :class:`~ziprl.policy.kv.RoomyLayer`'s keys or values), else ``t`` itself.

    torch's bfloat16 matmul copies an operand that is not contiguous or its exact transpose: a cache with room past
    its end would be copied whole, every layer, every decode step. The buffer's room must hold finite values (the
    layer zeroes it) and the caller masks its positions out."""
    b, h, n, d = t.shape
    s0, s1, s2, s3 = t.stride()
    if s3 != 1 or s2 != d or s1 % d or s1 // d <= n or s0 != h * s1:
        return t
    if t.untyped_storage().nbytes() < (t.storage_offset() + b * s0) * t.element_size():
        return t
    return t.as_strided((b, h, s1 // d, d), (s0, s1, d, 1))


def use_decode_attention(model: Any) -> bool:
    """Switch a half-precision CPU model running SDPA to :func:`decode_attention`; whether it was switched."""
    if model.dtype not in HALF or model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
