"""``grpo``: the paper's estimator, GRPO's group-normalised outcome reward (HRR is not part of it: its per-turn term
is added to every estimator by :func:`ziprl.learner.advantages.compute_advantages`, w = ``learner.hrr_weight``).

std is the *population* std (``ddof=0``) by default: the paper's sigma_group is "the standard deviation of the
group rewards", ddof=0 gives each group exactly unit-variance advantages and is defined for any group size.
OpenRLHF/TRL/verl use the unbiased ``torch.std`` (``ddof=1``); :func:`grpo_advantages` takes ``ddof`` for that.
With G=8 the two differ by a factor sqrt(7/8) ~ 0.94, i.e. a learning-rate rescale.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ziprl.config import LearnerConfig
from ziprl.registry import ADVANTAGES


def grpo_advantages(rewards: Sequence[float], eps: float, ddof: int = 0) -> np.ndarray:
    """A_GRPO for one group of G trajectories; all-equal rewards (or G = 1) give exactly 0."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size <= 1 or np.ptp(r) == 0:
        return np.zeros_like(r)
    # Eq. (GRPO advantage): A_i = (R_i - mean_group) / (std_group + eps)
    return (r - r.mean()) / (r.std(ddof=ddof) + eps)


@ADVANTAGES.register("grpo", order=0)
def grpo(rewards: Sequence[float], cfg: LearnerConfig) -> np.ndarray:
    """A_GRPO with eps = ``learner.adv_eps``."""
    return grpo_advantages(rewards, cfg.adv_eps)
