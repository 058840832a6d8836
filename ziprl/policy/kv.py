"""KV-cache calls of a transformers causal LM that differ across versions, and a shared prefix's cache.

transformers 5 names the cache argument and output ``cache`` (``past_key_values`` is deprecated and goes in 5.40);
4.x calls both ``past_key_values``. :func:`cache_kwarg` and :func:`output_cache` pick the model's own spelling.
:func:`prefix_cache` runs a prefix once and repeats its keys and values over a batch, so rows that start with the
same tokens (the system prompt of every turn) compute them once; gradients flow back through the repeat.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from torch import Tensor


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


def prefix_cache(model: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, batch: int) -> Any:
    """The KV cache of one row's prefix ``[1, S]``, repeated to ``batch`` rows (autograd sums their gradients)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                logits_to_keep=1)
    cache = output_cache(out)
    if cache is None:
        raise RuntimeError("the model returned no KV cache for the shared prefix (gradient checkpointing turns "
                           "caching off in training: set learner.share_prefix=false with it)")
    cache.batch_repeat_interleave(batch)
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
