"""Advantages: an estimator's A_i per trajectory + HRR's per-turn term (paper §3.4), pure numpy, no torch.

Estimators are registered in :data:`ziprl.registry.ADVANTAGES`, one module each in this package, and chosen by
``learner.advantage_estimator``: ``grpo`` (the paper's GRPO, the default), ``rloo`` (leave-one-out baseline),
``dr_grpo`` (Dr. GRPO: no std division; pair it with ``learner.loss_norm=constant``). An estimator is a function
``(rewards of one group, LearnerConfig) -> A_i per trajectory``. HRR is not an estimator: :func:`compute_advantages`,
the one entry point the trainer calls, takes the rollout's groups as they were formed, asks the estimator for each
group's A_i and adds HRR's per-turn term with w = ``learner.hrr_weight`` (w = 0: the estimator alone), centred on the
Q̄ that ``learner.hrr_reference`` names (:func:`hrr_reference`).

Choices:
- A group whose rewards are all equal (this includes a group of size 1) has no outcome signal: every A_i is
  exactly 0 (the estimator is not asked) and it counts as a zero-variance group. With
  ``drop_zero_variance_groups`` such groups are removed without a refill (``rollout.dynamic_sampling`` refills, as
  DAPO does), which also drops their HRR turn signal; by default they are kept and train on the HRR term alone.
- GRPO's std is the *population* std (``ddof=0``), see :func:`ziprl.learner.advantages.grpo.grpo_advantages`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ziprl.config import LearnerConfig
from ziprl.config.schema import HRR_REFERENCES
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory
from ziprl.registry import ADVANTAGES

Estimator = Callable[[Sequence[float], LearnerConfig], np.ndarray]  # one group's rewards -> A_i per trajectory


def hrr_reference(q_turns: Sequence[float | None], reference: str = "trajectory") -> list[float | None]:
    """The Q̄ each scored turn is compared with (None for an unscored turn).

    ``trajectory``: the paper's, one mean over every scored turn of the trajectory. ``causal``: the mean over the
    scored turns up to and including this one, so a turn's term does not depend on the turns its choice leads to
    (the first scored turn's term is 0)."""
    if reference == "trajectory":
        scored = [q for q in q_turns if q is not None]
        # Eq. (Q_bar): mean compression quality over the trajectory's scored turns
        q_bar = sum(scored) / len(scored) if scored else 0.0
        return [None if q is None else q_bar for q in q_turns]
    if reference != "causal":
        raise ValueError(f"hrr reference must be one of {HRR_REFERENCES}, got {reference!r}")
    out: list[float | None] = []
    total = n = 0
    for q in q_turns:
        if q is not None:
            total, n = total + q, n + 1
        out.append(None if q is None else total / n)
    return out


def hrr_turn_advantages(a_traj: float, q_turns: Sequence[float | None], w: float,
                        reference: str = "trajectory") -> list[float]:
    """Per-turn advantages of one trajectory; turns without a Q_com score (None) keep A_i."""
    if w == 0:
        return [float(a_traj)] * len(q_turns)
    # Eq. (advantage_adjust): A_ij = A_i + w * (Q_ij - Q_bar_i)
    return [float(a_traj) if q is None else float(a_traj + w * (q - q_bar))
            for q, q_bar in zip(q_turns, hrr_reference(q_turns, reference), strict=True)]


def carries_signal(group: Group, w: float) -> bool:
    """Whether :func:`compute_advantages` gives some turn of the group a non-zero advantage with HRR weight ``w``:
    its rewards differ, or (w != 0) some trajectory's scored turns differ in Q_com (with either reference: the first
    scored turn that differs from those before it also differs from their mean)."""
    rewards = [t.reward for t in group]
    if max(rewards) > min(rewards):
        return True
    if w == 0:
        return False
    scored = ([u.q_com for u in t.turns if u.q_com is not None] for t in group)
    return any(len(qs) > 1 and max(qs) > min(qs) for qs in scored)


@dataclass
class AdvantageResult:
    """The kept groups' trajectories (group after group, in input order) with their A_i and per-turn A_ij, plus
    batch statistics."""

    trajectories: list[Trajectory]
    traj_advantages: list[float]
    turn_advantages: list[list[float]]
    stats: dict[str, float] = field(default_factory=dict)


def compute_advantages(groups: Sequence[Group], cfg: LearnerConfig) -> AdvantageResult:
    """Per group: the estimator's A_i (``cfg.advantage_estimator``), then HRR's term per turn (w = ``cfg.hrr_weight``);
    zero-variance groups optionally dropped.

    stats: ``zero_variance_frac`` (over all groups, before dropping), ``num_groups``/``num_trajectories``/
    ``num_turns`` (kept), ``adv_mean``/``adv_std`` (over kept turns), ``hrr_abs_mean`` (mean |A_ij - A_i|
    over kept turns; 0 for unscored turns).
    """
    estimator: Estimator = ADVANTAGES[cfg.advantage_estimator]
    trajs: list[Trajectory] = []
    a_traj: list[float] = []
    zero_var = kept = 0
    for group in groups:
        rewards = np.array([t.reward for t in group], dtype=np.float64)
        if rewards.size > 1 and np.ptp(rewards) > 0:
            adv = np.asarray(estimator(rewards, cfg), dtype=np.float64)
        else:  # no outcome signal
            zero_var += 1
            if cfg.drop_zero_variance_groups:
                continue
            adv = np.zeros_like(rewards)
        kept += 1
        trajs += group.trajectories
        a_traj += adv.tolist()

    turn_adv = [hrr_turn_advantages(a, [u.q_com for u in t.turns], cfg.hrr_weight, cfg.hrr_reference)
                for t, a in zip(trajs, a_traj, strict=True)]
    flat = np.array([a for turns in turn_adv for a in turns], dtype=np.float64)
    hrr = np.array([a - a_i for a_i, turns in zip(a_traj, turn_adv, strict=True) for a in turns])
    stats = {
        "zero_variance_frac": zero_var / len(groups) if groups else 0.0,
        "num_groups": float(kept),
        "num_trajectories": float(len(trajs)),
        "num_turns": float(flat.size),
        "adv_mean": float(flat.mean()) if flat.size else 0.0,
        "adv_std": float(flat.std()) if flat.size else 0.0,
        "hrr_abs_mean": float(np.abs(hrr).mean()) if hrr.size else 0.0,
    }
    return AdvantageResult(trajectories=trajs, traj_advantages=a_traj, turn_advantages=turn_adv, stats=stats)
