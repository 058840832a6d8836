"""A KV cache with reserved room: decoding into it gives what the concatenating DynamicCache gives, through growth,
row selection and repeats; layers of other kinds are left alone. Forked caches and rows stacked into a padded batch."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer

from ziprl.policy.kv import RoomyLayer, cache_kwarg, fork, output_cache, reserve_room, stack_rows


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def _decode(model: LlamaForCausalLM, room: int | None, steps: int, drop_row_at: int | None = None) -> list[torch.Tensor]:
    """Greedy decode of a 3-row batch; ``room`` None keeps the concatenating cache. Returns each step's logits."""
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (3, 5))
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache = output_cache(out)
        if room is not None:
            reserve_room(cache, room)
        logits = [out.logits[:, -1]]
        for step in range(steps):
            tok = logits[-1].argmax(-1, keepdim=True)
            if step == drop_row_at:
                keep = torch.tensor([0, 2])
                cache.batch_select_indices(keep)
                tok = tok[keep]
            out = model(input_ids=tok, use_cache=True, **{cache_kwarg(model): cache})
            logits.append(out.logits[:, -1])
    return logits


@pytest.mark.parametrize("room", [1, 3, 64])  # grows every step, every third step, never
def test_room_decodes_as_concatenation_does(model, room):
    ref = _decode(model, None, 10, drop_row_at=4)
    got = _decode(model, room, 10, drop_row_at=4)
    assert [t.shape for t in got] == [t.shape for t in ref]
    assert got[-1].shape[0] == 2
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_reserve_room_writes_in_place_and_keeps_other_layers():
    keys, values = torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4, 3)
    cache = DynamicCache()
    cache.update(keys, values, 0)
    other = DynamicLayer()  # not initialized: nothing to reserve
    cache.layers.append(other)
    reserve_room(cache, 5)
    layer = cache.layers[0]
    assert isinstance(layer, RoomyLayer)
    assert cache.layers[1] is other
    assert torch.equal(layer.keys, keys)
    assert layer.get_seq_length() == 4
    buf = layer._key_buf
    new_k, new_v = torch.randn(2, 1, 1, 3), torch.randn(2, 1, 1, 3)
    k, v = layer.update(new_k, new_v)
    assert layer._key_buf is buf
    assert k.data_ptr() == buf.data_ptr()  # appended into the room, nothing copied
    assert torch.equal(k, torch.cat([keys, new_k], 2))
    assert torch.equal(v, torch.cat([values, new_v], 2))
    layer.batch_repeat_interleave(2)
    assert layer.keys.shape == (4, 1, 5, 3)
    assert torch.equal(layer.keys[1], layer.keys[0])
    layer.crop(-2)
    assert layer.get_seq_length() == 3
    assert torch.equal(layer.keys[0], keys[0, :, :3])
    with pytest.raises(ValueError, match="negative"):
        layer.crop(1)
    layer.reset()
    assert layer.get_seq_length() == 0


def test_fork_leaves_the_original_as_it_was():
    cache = DynamicCache()
    keys = torch.randn(1, 1, 3, 2)
    cache.update(keys, keys.clone(), 0)
    forked = fork(cache)
    forked.update(torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), 0)
    assert forked.get_seq_length() == 5
    assert cache.get_seq_length() == 3
    assert torch.equal(cache.layers[0].keys, keys)


def test_stack_rows_lays_rows_out_as_a_left_padded_batch():
    """Row lengths 2 + 1 and 2 + 3 after a 2-position prefix, width 5: the short row's own position sits at the right
    end, zeros between, room after."""
    rows = []
    for n in (3, 5):
        cache = DynamicCache()
        k = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1) + 10 * n
        cache.update(k, -k, 0)
        rows.append(cache)
    batch = stack_rows(rows, prefix=2, width=5, room=4)
    layer = batch.layers[0]
    assert isinstance(layer, RoomyLayer)
    assert layer._key_buf.shape == (2, 1, 9, 1)
    assert layer.get_seq_length() == 5
    assert layer.keys[:, 0, :, 0].tolist() == [[30, 31, 0, 0, 32], [50, 51, 52, 53, 54]]
    assert torch.equal(layer.values, -layer.keys)
