"""Learner: trajectories -> one optimiser step -> named weights. Advantages (registered estimators, GRPO + HRR by
default), token-level losses (registered), the DeepSpeed trainer, checkpoints, SFT cold start.

Names are imported on first use, so ``ziprl.learner.advantages`` (pure numpy) and the registration modules stay
free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AdvantageResult": "advantages",
    "compute_advantages": "advantages",
    "policy_loss": "losses.ppo_clip",
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
