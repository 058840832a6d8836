"""``rloo``: REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics"): each trajectory's baseline is the
mean reward of the other G - 1 samples of its question, no std division. HRR's per-turn term is added as for
every estimator (``learner.hrr_weight``; set it to 0 for RLOO alone)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ziprl.config import LearnerConfig
from ziprl.registry import ADVANTAGES


@ADVANTAGES.register("rloo", order=1)
def rloo_advantages(rewards: Sequence[float], cfg: LearnerConfig | None = None) -> np.ndarray:
    """A_RLOO for one group of G >= 2 trajectories (equals G / (G - 1) * (R_i - mean_group))."""
    r = np.asarray(rewards, dtype=np.float64)
    # Eq. (RLOO): A_i = R_i - 1/(G - 1) * sum_{j != i} R_j
    return r - (r.sum() - r) / (r.size - 1)
