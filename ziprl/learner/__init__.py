"""Learner: advantages (GRPO + HRR), token-level losses, the DeepSpeed trainer, checkpoints, SFT cold start.

Names are imported on first use, so ``ziprl.learner.advantages`` (pure numpy) stays free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AdvantageResult": "advantages",
    "compute_advantages": "advantages",
    "policy_loss": "losses",
    "build_rows": "batch",
    "make_micro_batches": "batch",
    "Trainer": "trainer",
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "latest_checkpoint": "checkpoint",
    "SFTRow": "sft",
    "sft_rows": "sft",
    "run_sft": "sft",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
