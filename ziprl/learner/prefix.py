"""A step's shared prefix (the system prompt every turn starts with) run once per step, not once per micro-batch.

:class:`StepPrefix` runs the prefix's forward once and hands each micro-batch its keys and values. With gradients,
every micro-batch but the last reads detached copies and its backward leaves their gradient there (summed in float32
over the micro-batches); the last reads the prefix's own outputs, and its loss carries the others' summed gradient
(:meth:`StepPrefix.carried`), so its one backward runs the prefix's backward once for the whole step. Each rank keeps
its number of backward passes, so ZeRO's per-pass gradient reductions stay in step across ranks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ziprl.policy.kv import fork, run_prefix


class StepPrefix:
    """The KV cache of ``input_ids`` (``[1, S]``, positions 0 .. S-1) computed once by ``model``; with ``grad``, kept in
    the autograd graph for the step's last micro-batch (see the module docstring)."""

    def __init__(self, model: Any, input_ids: Tensor, grad: bool) -> None:
        with torch.set_grad_enabled(grad):
            self._cache = run_prefix(model, input_ids)
        self.length = int(input_ids.size(1))
        self._states = [(layer.keys, layer.values) for layer in self._cache.layers]
        self._copies = ([tuple(t.detach().requires_grad_() for t in kv) for kv in self._states] if grad
                        else self._states)
        self._summed: list[Tensor] | None = None

    def cache(self, batch: int, last: bool = True) -> Any:
        """A KV cache of the prefix for ``batch`` rows: the prefix's own outputs when ``last``, else its detached
        copies (a gradient into them waits for :meth:`collect`)."""
        cache = fork(self._cache)
        for layer, (keys, values) in zip(cache.layers, self._states if last else self._copies, strict=True):
            layer.keys, layer.values = keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1)
        return cache

    def collect(self) -> None:
        """Add the gradient a backward left in the detached copies to the step's float32 sum, and clear it."""
        grads = [t.grad for kv in self._copies for t in kv]
        if all(g is None for g in grads):
            return
        if self._summed is None:
            self._summed = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) for kv in self._copies
                            for t in kv]
        for total, kv_grad in zip(self._summed, grads, strict=True):
            if kv_grad is not None:
                total += kv_grad.float()
        for kv in self._copies:
            for t in kv:
                t.grad = None

    def carried(self) -> Tensor | float:
        """A term whose gradient into the prefix's outputs is the summed gradient :meth:`collect` gathered: added to the
        last micro-batch's loss, its backward takes the prefix's backward for every micro-batch at once."""
        if self._summed is None:
            return 0.0
        outputs = [t for kv in self._states for t in kv]
        return sum((out * g.to(out.dtype)).sum() for out, g in zip(outputs, self._summed, strict=True))
