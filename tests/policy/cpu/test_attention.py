"""Half-precision CPU decode attention: float32 attention's result for a one-token query (unmasked or
padding-masked, over a whole cache or the front of a buffer with room), SDPA itself for everything else, and
switched on only for half-precision CPU models."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ziprl.policy.cpu.attention import NAME, decode_attention, tight, use_decode_attention
from ziprl.policy.kv import RoomyLayer, cache_kwarg, output_cache


class _Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def _qkv(q_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, q_len, 16, generator=g).to(dtype)
    k = torch.randn(4, 2, 37, 16, generator=g).to(dtype)
    return q, k, torch.randn(4, 2, 37, 16, generator=g).to(dtype)


def _masks() -> dict[str, torch.Tensor | None]:
    keep = torch.ones(4, 1, 1, 37, dtype=torch.bool)
    keep[0, ..., :3] = False  # row 0: three left-padding positions
    keep[2, ..., :11] = False
    return {"none": None, "bool": keep,
            "additive": torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("roomy", [False, True])
def test_one_query_matches_float32_attention(dtype, mask_kind, roomy):
    """One query per row, unmasked or padding-masked (boolean or additive), over keys and values given whole or as
    the front of a buffer with room past them (a RoomyLayer's, zeroed there): float32 attention's result."""
    q, k, v = _qkv(1, dtype)
    mask = _masks()[mask_kind]
    if roomy:
        k, v = (RoomyLayer.with_room(t, 50)[:, :, :37] for t in (k, v))
        assert not k.is_contiguous()
        assert tight(k).shape == (4, 2, 50, 16)
    out, weights = decode_attention(_Module(), q, k, v, mask if mask_kind != "additive" else mask.to(dtype),
                                    scaling=0.3)
    kr, vr = (t.float().repeat_interleave(3, dim=1) for t in (k, v))  # query head i reads key/value head i // 3
    scores = q.float() @ kr.transpose(-1, -2) * 0.3
    if mask is not None:
        scores = scores.masked_fill(~_masks()["bool"], float("-inf"))
    ref = torch.softmax(scores, dim=-1) @ vr
    assert weights is None
    assert out.shape == (4, 1, 6, 16)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.transpose(1, 2), atol=2e-2, rtol=2e-2)


def test_tight_widens_only_the_front_of_a_contiguous_buffer():
    buf = torch.arange(2 * 3 * 10 * 4, dtype=torch.float32).reshape(2, 3, 10, 4)
    front = buf[:, :, :7]
    assert torch.equal(tight(front), buf)
    assert tight(front).data_ptr() == buf.data_ptr()
    whole = buf.clone()
    assert tight(whole) is whole  # already contiguous
    for other in (buf[:, :, 2:9], buf[:, :, :7, :3], buf[:1, :2, :7], buf.transpose(2, 3)[:, :, :3]):
        assert tight(other) is other  # not the front of a buffer of its own rows and heads


@pytest.mark.parametrize("case", ["prefill", "float32"])
def test_other_calls_are_sdpa_itself(case):
    q, k, v = _qkv(5 if case == "prefill" else 1, torch.float32 if case == "float32" else torch.bfloat16)
    mask = torch.ones(4, 1, q.shape[2], 37, dtype=torch.bool)
    mask[0, ..., :3] = False
    got, _ = decode_attention(_Module(), q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=0.25)
    assert torch.equal(got, ref)


def _tiny(dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa",
                      initializer_range=0.3)  # attention that moves the logits
    return LlamaForCausalLM(cfg).to(dtype).eval()


def _decode_logits(model: LlamaForCausalLM) -> torch.Tensor:
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        cache = output_cache(model(input_ids=ids, use_cache=True))
        steps = [model(input_ids=ids[:, :1] + t, use_cache=True, **{cache_kwarg(model): cache}).logits
                 for t in range(4)]
    return torch.cat(steps, 1).float()


def test_switched_on_for_half_precision_cpu_models_only():
    half = _tiny(torch.bfloat16)
    ref = _decode_logits(half)
    assert use_decode_attention(half)
    assert half.config._attn_implementation == NAME
    torch.testing.assert_close(_decode_logits(half), ref, atol=0.5, rtol=0)  # logits up to ~6.4
    full = _tiny(torch.float32)
    assert not use_decode_attention(full)
    assert full.config._attn_implementation == "sdpa"
