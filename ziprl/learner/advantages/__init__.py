"""Advantages: an estimator's A_i per trajectory + HRR's per-turn term (paper §3.4), pure numpy, no torch.

Estimators are registered in :data:`ziprl.registry.ADVANTAGES`, one module each in this package, and chosen by
``learner.advantage_estimator``: ``grpo_hrr`` (the paper's GRPO, the default), ``rloo`` (leave-one-out
baseline), ``dr_grpo`` (Dr. GRPO: no std division; pair it with ``learner.loss_norm=constant``). An estimator is
a function ``(rewards of one group, LearnerConfig) -> A_i per trajectory``. :func:`compute_advantages`, the
one entry point the trainer calls, groups the trajectories and adds HRR's per-turn term to every estimator's
A_i with w = ``learner.hrr_weight`` (w = 0: the estimator alone, e.g. plain GRPO).

Choices:
- A group whose rewards are all equal (this includes a group of size 1) has no outcome signal: every A_i is
  exactly 0 (the estimator is not asked) and it counts as a zero-variance group. With
  ``drop_zero_variance_groups`` such groups are removed without a refill (``rollout.dynamic_sampling`` refills, as
  DAPO does), which also drops their HRR turn signal; by default they are kept and train on the HRR term alone.
- GRPO's std is the *population* std (``ddof=0``), see :func:`ziprl.learner.advantages.grpo_hrr.grpo_advantages`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ziprl.config import LearnerConfig
from ziprl.env.trajectory import Trajectory
from ziprl.registry import ADVANTAGES

Estimator = Callable[[Sequence[float], LearnerConfig], np.ndarray]  # one group's rewards -> A_i per trajectory


def hrr_turn_advantages(a_traj: float, q_turns: Sequence[float | None], w: float) -> list[float]:
    """Per-turn advantages of one trajectory; turns without a Q_com score (None) keep A_i."""
    scored = [q for q in q_turns if q is not None]
    if not scored or w == 0:
        return [float(a_traj)] * len(q_turns)
    # Eq. (Q_bar): mean compression quality over the trajectory's scored turns
    q_bar = sum(scored) / len(scored)
    # Eq. (advantage_adjust): A_ij = A_GRPO_i + w * (Q_ij - Q_bar_i)
    return [float(a_traj) if q is None else float(a_traj + w * (q - q_bar)) for q in q_turns]


@dataclass
class AdvantageResult:
    """Kept trajectories (input order) with their A_i and per-turn A_ij, plus batch statistics."""

    trajectories: list[Trajectory]
    traj_advantages: list[float]
    turn_advantages: list[list[float]]
    stats: dict[str, float] = field(default_factory=dict)


def compute_advantages(trajectories: Sequence[Trajectory], cfg: LearnerConfig) -> AdvantageResult:
    """Group by ``group_id``, apply the estimator (``cfg.advantage_estimator``) then HRR (w = ``cfg.hrr_weight``),
    optionally drop zero-variance groups.

    stats: ``zero_variance_frac`` (over all groups, before dropping), ``num_groups``/``num_trajectories``/
    ``num_turns`` (kept), ``adv_mean``/``adv_std`` (over kept turns), ``hrr_abs_mean`` (mean |A_ij - A_i|
    over kept turns; 0 for unscored turns).
    """
    estimator: Estimator = ADVANTAGES[cfg.advantage_estimator]
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        if not t.group_id:
            raise ValueError(
                f"trajectory {i} (question {t.question_id!r}) has no group_id; GRPO needs the rollout to tag "
                "the G samples of each question with a shared group_id"
            )
        groups.setdefault(t.group_id, []).append(i)

    a_traj: dict[int, float] = {}
    zero_var = 0
    for members in groups.values():
        rewards = np.array([trajectories[i].reward for i in members], dtype=np.float64)
        if rewards.size <= 1 or np.ptp(rewards) == 0:  # no outcome signal
            zero_var += 1
            if cfg.drop_zero_variance_groups:
                continue
            adv = np.zeros_like(rewards)
        else:
            adv = np.asarray(estimator(rewards, cfg), dtype=np.float64)
        a_traj.update(zip(members, adv.tolist(), strict=True))

    kept = sorted(a_traj)
    turn_adv = [
        hrr_turn_advantages(a_traj[i], [u.q_com for u in trajectories[i].turns], cfg.hrr_weight) for i in kept
    ]
    flat = np.array([a for turns in turn_adv for a in turns], dtype=np.float64)
    hrr = np.array([a - a_traj[i] for i, turns in zip(kept, turn_adv, strict=True) for a in turns])
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
        traj_advantages=[a_traj[i] for i in kept],
        turn_advantages=turn_adv,
        stats=stats,
    )
