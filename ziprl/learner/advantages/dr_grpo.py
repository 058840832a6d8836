"""``dr_grpo``: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO without its two
normalisations. The std division goes here (the advantage is the reward minus the group mean); the 1/|o_i|
length normalisation goes in the loss: set ``learner.loss_norm=constant`` (every token weighs 1/(G L), L the
generation budget ``env.max_turns x sampling.max_new_tokens``). HRR's per-turn term is added as for every
estimator (``learner.hrr_weight``; set it to 0 for Dr. GRPO alone)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ziprl.config import LearnerConfig
from ziprl.registry import ADVANTAGES


@ADVANTAGES.register("dr_grpo", order=2)
def dr_grpo_advantages(rewards: Sequence[float], cfg: LearnerConfig | None = None) -> np.ndarray:
    """A_Dr.GRPO for one group: the outcome reward centred on the group mean, not scaled."""
    r = np.asarray(rewards, dtype=np.float64)
    # Eq. (Dr. GRPO advantage): A_i = R_i - mean_group
    return r - r.mean()
