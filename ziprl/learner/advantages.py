"""Advantages: GRPO per trajectory (group-normalised outcome reward) + HRR per turn (paper §3.4).

Pure numpy, no torch. ``compute_advantages`` is the one entry point the trainer calls.

Choices:
- std is the *population* std (``ddof=0``) by default: the paper's sigma_group is "the standard deviation
  of the group rewards", ddof=0 gives each group exactly unit-variance advantages and is defined for any
  group size. OpenRLHF/TRL/verl use the unbiased ``torch.std`` (``ddof=1``); ``grpo_advantages`` takes
  ``ddof`` for that. With G=8 the two differ by a factor sqrt(7/8) ~ 0.94, i.e. a learning-rate rescale.
- A group whose rewards are all equal (this includes a group of size 1) has no outcome signal:
  A_GRPO = 0 exactly (not (R - mean)/eps round-off) and it counts as a zero-variance group.
  With ``drop_zero_variance_groups`` such groups are removed (OpenRLHF/verl/DAPO dynamic sampling),
  which also drops their HRR turn signal; by default they are kept and train on the HRR term alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ziprl.config import LearnerConfig
from ziprl.env.trajectory import Trajectory


def grpo_advantages(rewards: Sequence[float], eps: float, ddof: int = 0) -> np.ndarray:
    """A_GRPO for one group of G trajectories; all-equal rewards (or G = 1) give exactly 0."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size <= 1 or np.ptp(r) == 0:
        return np.zeros_like(r)
    # Eq. (GRPO advantage): A_i = (R_i - mean_group) / (std_group + eps)
    return (r - r.mean()) / (r.std(ddof=ddof) + eps)


def hrr_turn_advantages(a_traj: float, q_turns: Sequence[float | None], w: float) -> list[float]:
    """Per-turn advantages of one trajectory; turns without a Q_com score (None) keep A_GRPO."""
    scored = [q for q in q_turns if q is not None]
    if not scored or w == 0:
        return [float(a_traj)] * len(q_turns)
    # Eq. (Q_bar): mean compression quality over the trajectory's scored turns
    q_bar = sum(scored) / len(scored)
    # Eq. (advantage_adjust): A_ij = A_GRPO_i + w * (Q_ij - Q_bar_i)
    return [float(a_traj) if q is None else float(a_traj + w * (q - q_bar)) for q in q_turns]


@dataclass
class AdvantageResult:
    """Kept trajectories (input order) with their A_GRPO and per-turn A_ij, plus batch statistics."""

    trajectories: list[Trajectory]
    traj_advantages: list[float]
    turn_advantages: list[list[float]]
    stats: dict[str, float] = field(default_factory=dict)


def compute_advantages(trajectories: Sequence[Trajectory], cfg: LearnerConfig) -> AdvantageResult:
    """Group by ``group_id``, apply GRPO then HRR (w = ``cfg.hrr_weight``), optionally drop zero-variance groups.

    stats: ``zero_variance_frac`` (over all groups, before dropping), ``num_groups``/``num_trajectories``/
    ``num_turns`` (kept), ``adv_mean``/``adv_std`` (over kept turns), ``hrr_abs_mean`` (mean |A_ij - A_i|
    over kept turns; 0 for unscored turns).
    """
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        if not t.group_id:
            raise ValueError(
                f"trajectory {i} (question {t.question_id!r}) has no group_id; GRPO needs the rollout to tag "
                "the G samples of each question with a shared group_id"
            )
        groups.setdefault(t.group_id, []).append(i)

    a_grpo: dict[int, float] = {}
    zero_var = 0
    for members in groups.values():
        adv = grpo_advantages([trajectories[i].reward for i in members], cfg.adv_eps)
        if not adv.any():
            zero_var += 1
            if cfg.drop_zero_variance_groups:
                continue
        a_grpo.update(zip(members, adv.tolist(), strict=True))

    kept = sorted(a_grpo)
    turn_adv = [
        hrr_turn_advantages(a_grpo[i], [u.q_com for u in trajectories[i].turns], cfg.hrr_weight) for i in kept
    ]
    flat = np.array([a for turns in turn_adv for a in turns], dtype=np.float64)
    hrr = np.array([a - a_grpo[i] for i, turns in zip(kept, turn_adv, strict=True) for a in turns])
    stats = {
        "zero_variance_frac": zero_var / len(groups) if groups else 0.0,
        "num_groups": float(len({trajectories[i].group_id for i in kept})),
        "num_trajectories": float(len(kept)),
        "num_turns": float(flat.size),
        "adv_mean": float(flat.mean()) if flat.size else 0.0,
        "adv_std": float(flat.std()) if flat.size else 0.0,
        "hrr_abs_mean": float(np.abs(hrr).mean()) if hrr.size else 0.0,
    }
    return AdvantageResult(
        trajectories=[trajectories[i] for i in kept],
        traj_advantages=[a_grpo[i] for i in kept],
        turn_advantages=turn_adv,
        stats=stats,
    )
