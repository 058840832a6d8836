"""KV-cache calls of a transformers causal LM that differ across versions, and a shared prefix's cache.

transformers 5 names the cache argument and output ``cache`` (``past_key_values`` is deprecated and goes in 5.40);
4.x calls both ``past_key_values``. :func:`cache_kwarg` and :func:`output_cache` pick the model's own spelling.
:func:`prefix_cache` runs a prefix once and repeats its keys and values over a batch, so rows that start with the
same tokens (the system prompt of every turn) compute them once; gradients flow back through the repeat.
:func:`last_positions` asks for the logits of the last positions in the form that keeps the LM head fast.
:func:`reserve_room` lets a decode loop append to the cache in place instead of copying it every step; :func:`fork`
and :func:`stack_rows` let prompts of unequal length prefill one at a time after a shared prefix, then decode as one
batch.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import DynamicLayer


@lru_cache(maxsize=16)
def _forward_params(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def cache_kwarg(model: Any) -> str:
    """The keyword ``model``'s forward takes its KV cache under (a DeepSpeed engine is looked through)."""
    inner = getattr(model, "module", model)
    return "cache" if "cache" in _forward_params(type(inner)) else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned."""
    found = getattr(out, "cache", None)
    return found if found is not None else out.past_key_values


def last_positions(n: int, length: int, device: torch.device | str) -> Tensor:
    """``logits_to_keep`` for the last ``n`` of ``length`` positions, as indices rather than the integer ``n``.

    Given an integer, transformers slices the hidden states ``[:, -n:]``: a non-contiguous view of a batch, on which
    torch's CPU linear with a frozen weight (a reference model) copies the LM head once per row (SmolLM2's 49k x 576
    head, batch 8, one thread, bf16: 826 ms for n = 1 and 932 ms for n = 52, against 9 and 135 ms on a contiguous
    input; float32 n = 52: 439 vs 316 ms). Indices gather a contiguous copy."""
    return torch.arange(length - n, length, device=device)


def prefix_cache(model: Any, input_ids: Tensor, batch: int) -> Any:
    """The KV cache of one row's prefix ``[1, S]`` (unpadded, at positions 0 .. S-1: a shared prefix leads every row),
    repeated to ``batch`` rows (autograd sums their gradients)."""
    cache = run_prefix(model, input_ids)
    cache.batch_repeat_interleave(batch)
    return cache


def extend_prefix(model: Any, cache: Any, input_ids: Tensor, batch: int) -> Any:
    """``cache`` (one row's prefix) run on through ``input_ids`` ``[1, S']`` (the positions right after it), its keys
    and values then viewed as ``batch`` rows (autograd sums their gradients, into ``cache``'s own tensors too)."""
    cache = output_cache(model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache}))
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1)
    return cache


def run_prefix(model: Any, input_ids: Tensor) -> Any:
    """The KV cache of one row's prefix ``[1, S]`` (its forward, under the caller's grad mode)."""
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)  # one row: its last position is contiguous
    cache = output_cache(out)
    if cache is None:
        raise RuntimeError("the model returned no KV cache for the shared prefix (gradient checkpointing turns "
                           "caching off in training: set learner.share_prefix=false with it)")
    return cache


def shared_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``prompts`` share, leaving each at least one token of its own (its last token's
    logits are the next prediction); 0 for a single prompt."""
    if len(prompts) < 2:
        return 0
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        n = next((i for i in range(n) if first[i] != p[i]), n)
    return max(n, 0)


def reserve_room(cache: Any, room: int) -> None:
    """Give each full-attention layer of a ``DynamicCache`` spare room for ``room`` more positions, so that decoding
    writes each new key and value in place (inference only: autograd cannot see through the in-place writes).

    ``DynamicLayer`` concatenates, copying the whole cache on every decode step: at 700 cached tokens, batch 8, that
    copy was 11% of SmolLM2-135M's float32 decode step on one CPU thread. Caches of other kinds are left as they are.
    """
    for i, layer in enumerate(getattr(cache, "layers", ())):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.get_seq_length() > 0:
            n = layer.get_seq_length()
            cache.layers[i] = RoomyLayer(RoomyLayer.with_room(layer.keys, n + room),
                                         RoomyLayer.with_room(layer.values, n + room), n, room)


def fork(cache: Any) -> Any:
    """A copy of a ``DynamicCache`` that later updates leave the original out of: its tensors are shared, not copied
    (a ``DynamicLayer`` update concatenates into new tensors)."""
    forked = copy.copy(cache)
    forked.layers = [copy.copy(layer) for layer in cache.layers]
    return forked


def stack_rows(caches: Sequence[Any], prefix: int, width: int, room: int) -> Any:
    """One batch KV cache (``caches[0]``, its layers replaced) from the one-row ``DynamicCache``s of prompts of unequal
    lengths, laid out as a left-padded batch prefill lays it out: each row's first ``prefix`` positions (the shared
    prompt) on the left, its other positions right-aligned to ``width``, zeros between (padding, masked), and ``room``
    free positions after ``width``."""
    batch = caches[0]
    for i in range(len(batch.layers)):
        bufs = []
        for name in ("keys", "values"):
            rows = [getattr(c.layers[i], name) for c in caches]
            buf = rows[0].new_zeros((len(rows), rows[0].shape[1], width + room, rows[0].shape[-1]))
            for b, row in enumerate(rows):
                own = row.shape[-2] - prefix
                buf[b, :, :prefix] = row[0, :, :prefix]
                buf[b, :, width - own : width] = row[0, :, prefix:]
            bufs.append(buf)
        batch.layers[i] = RoomyLayer(*bufs, width, room)
    return batch


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers with spare room past their end: an update
    writes into the room (when full, the buffers grow by ``room`` more positions, one copy)."""

    def __init__(self, key_buf: Tensor, value_buf: Tensor, length: int, room: int) -> None:
        super().__init__()
        self.room, self.is_initialized, self.device = room, True, key_buf.device
        self._set(key_buf, value_buf, length)

    @staticmethod
    def with_room(t: Tensor, capacity: int) -> Tensor:
        """``t`` copied into the start of a buffer of ``capacity`` positions, the rest zero (attention may read the
        whole buffer and mask the room out: :func:`ziprl.policy.cpu.attention.tight`)."""
        buf = t.new_empty((*t.shape[:-2], capacity, t.shape[-1]))
        buf[..., : t.shape[-2], :] = t
        buf[..., t.shape[-2] :, :] = 0
        return buf

    def _set(self, key_buf: Tensor, value_buf: Tensor, length: int) -> None:
        self._key_buf, self._value_buf, self._length = key_buf, value_buf, length
        self.keys, self.values = key_buf[..., :length, :], value_buf[..., :length, :]

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._key_buf.shape[-2]:
            self._set(self.with_room(self.keys, end + self.room), self.with_room(self.values, end + self.room),
                      self._length)
        self._key_buf[..., self._length : end, :] = key_states
        self._value_buf[..., self._length : end, :] = value_states
        self._set(self._key_buf, self._value_buf, end)
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        self._set(self._key_buf[indices], self._value_buf[indices], self._length)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._set(self._key_buf.repeat_interleave(repeats, 0), self._value_buf.repeat_interleave(repeats, 0),
                  self._length)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of positions to remove, got {tokens_to_remove}")
        self._set(self._key_buf, self._value_buf, self._length + tokens_to_remove)

    def reset(self) -> None:
        self._set(self._key_buf, self._value_buf, 0)

