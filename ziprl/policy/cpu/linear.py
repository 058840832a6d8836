"""Linear layers of a bfloat16 model generating on CPU, their weights packed once for oneDNN.

torch's CPU ``linear`` reorders a bfloat16 weight into oneDNN's blocked layout at every call, and a decode step is
mostly its ~200 matrix-vector products. Packed once per weight version, SmolLM2-135M's decode steps on one thread
ran 1.15-1.38x faster at batch 1-4 with identical logits (``benchmarks/cpu_kernels.py``). The packed copies cost the
linear weights' memory once more, and :func:`repack` after every weight refresh (~0.1-0.2 s for SmolLM2-135M).
"""

from __future__ import annotations

from typing import Any

import torch


def can_pack(model: Any) -> bool:
    """A bfloat16 model on a CPU with oneDNN's bfloat16 kernels."""
    return (model.dtype == torch.bfloat16 and model.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedForward:
    """The forward of one ``nn.Linear`` from its weight packed for oneDNN (inference only: no autograd)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        self.linear = linear
        self.pack()

    def pack(self) -> None:
        """(Re)pack the layer's current weight."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.linear.weight.detach(), None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.linear.bias, "none", [], "")


def pack_linears(model: Any) -> bool:
    """Route every ``nn.Linear`` of ``model`` through :class:`PackedForward` when :func:`can_pack`; whether it did."""
    if not can_pack(model):
        return False
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = PackedForward(module)
    return True


def repack(model: Any) -> None:
    """Pack the new weights of every layer :func:`pack_linears` routed (after the weights were replaced)."""
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), PackedForward):
            module.forward.pack()
