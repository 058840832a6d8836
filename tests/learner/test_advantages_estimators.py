"""Registered advantage estimators, policy losses and loss normalisations: hand-computed numbers, the config's name
checks, and an entry registered in a test used by compute_advantages and the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ziprl.config import ConfigError, LearnerConfig, load_config
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.learner.advantages import compute_advantages
from ziprl.learner.advantages.dr_grpo import dr_grpo_advantages
from ziprl.learner.advantages.grpo import grpo
from ziprl.learner.advantages.rloo import rloo_advantages
from ziprl.learner.losses import token_weight
from ziprl.registry import ADVANTAGES, LOSS_NORMS, LOSSES
from ziprl.testing.learner import make_cfg, make_groups, requires_deepspeed


def test_registered_names_in_order():
    assert ADVANTAGES.names() == ("grpo", "rloo", "dr_grpo")
    assert LOSSES.names() == ("ppo_clip",)
    assert LOSS_NORMS.names() == ("trajectory", "token", "constant")


def test_grpo_hand_values():
    # mean 0.5, population std 0.5: A = (R - 0.5) / 0.5
    np.testing.assert_allclose(grpo([1, 0, 0, 1], LearnerConfig(adv_eps=0.0)), [1.0, -1.0, -1.0, 1.0])
    np.testing.assert_allclose(grpo([1, 0, 0, 1], LearnerConfig(adv_eps=0.5)), [0.5, -0.5, -0.5, 0.5])


def test_rloo_hand_values():
    # R_0 = 1, others (0, 0, 1) mean 1/3 -> 2/3 ; R_1 = 0, others (1, 0, 1) mean 2/3 -> -2/3
    np.testing.assert_allclose(rloo_advantages([1, 0, 0, 1]), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # 1 - (0.5 + 0) / 2 = 0.75 ; 0.5 - (1 + 0) / 2 = 0 ; 0 - (1 + 0.5) / 2 = -0.75
    np.testing.assert_allclose(rloo_advantages([1, 0.5, 0]), [0.75, 0.0, -0.75])


def test_dr_grpo_hand_values():
    np.testing.assert_allclose(dr_grpo_advantages([1, 0, 0, 1]), [0.5, -0.5, -0.5, 0.5])  # no std division
    np.testing.assert_allclose(dr_grpo_advantages([1, 0.5, 0]), [0.5, 0.0, -0.5])


def traj(group: str, reward: float, qs: list[float | None]) -> Trajectory:
    return Trajectory(question_id=group, question="q", answers=["a"], group_id=group, reward=reward,
                      turns=[Turn(q_com=q) for q in qs])


def group(*trajectories: Trajectory) -> Group:
    return Group(trajectories)


@pytest.mark.parametrize(("name", "a"), [("rloo", 2.0), ("dr_grpo", 1.0)])
def test_hrr_is_added_to_every_estimator(name, a):
    """Two trajectories rewarded 1 and 0: RLOO gives +-1 * 2 (its baseline is the other one), Dr. GRPO +-0.5 * 2;
    w = 0.5 adds 0.5 (Q_ij - Q_bar_i) per scored turn; an all-equal group gets exactly 0, and HRR only."""
    groups = [group(traj("g", 1.0, [0.9, 0.5]), traj("g", 0.0, [None, 0.2])),
              group(traj("h", 1.0, [0.4, 0.8]), traj("h", 1.0, [0.3]))]
    res = compute_advantages(groups, LearnerConfig(advantage_estimator=name, hrr_weight=0.5))
    assert res.traj_advantages == [a / 2, -a / 2, 0.0, 0.0]
    # Q_bar: 0.7 -> +-0.2 * 0.5 ; one scored turn -> 0 ; 0.6 -> -+0.2 * 0.5 ; one scored turn -> 0
    want = [[a / 2 + 0.1, a / 2 - 0.1], [-a / 2, -a / 2], [-0.1, 0.1], [0.0]]
    for got, w in zip(res.turn_advantages, want, strict=True):
        np.testing.assert_allclose(got, w, atol=1e-12)
    assert res.stats["zero_variance_frac"] == 0.5


def test_an_estimator_registered_in_a_test_is_used(monkeypatch):
    ADVANTAGES.names()
    monkeypatch.setitem(ADVANTAGES._entries, "sign", (50, lambda rewards, cfg: np.sign(np.asarray(rewards) - 0.5)))
    cfg = load_config(None, ["learner.advantage_estimator=sign", "learner.hrr_weight=0"])
    res = compute_advantages([group(traj("g", 1.0, [0.1]), traj("g", 0.0, [0.2]))], cfg.learner)
    assert res.turn_advantages == [[1.0], [-1.0]]


@pytest.mark.parametrize(("override", "needle"), [
    ("learner.advantage_estimator=ppo", "learner.advantage_estimator must be a registered estimator "
                                        "(grpo, rloo, dr_grpo), got 'ppo'"),
    ("learner.advantage_estimator=grpo_hrr", "learner.advantage_estimator=grpo_hrr is no more: HRR is not an "
                                             "estimator but a per-turn term added to any of them; set "
                                             "learner.advantage_estimator=grpo (YAML: advantage_estimator: grpo) and "
                                             "the HRR weight learner.hrr_weight"),
    ("learner.policy_loss=gspo", "learner.policy_loss must be a registered loss (ppo_clip), got 'gspo'"),
    ("learner.loss_norm=seq", "learner.loss_norm must be a registered normalisation (trajectory, token, constant), "
                              "got 'seq'"),
    ("learner.hrr_reference=future", "learner.hrr_reference must be trajectory or causal, got 'future'"),
])
def test_config_checks_the_names(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [override])


def test_dr_grpo_is_expressible_in_the_config():
    lc = load_config(None, ["learner.advantage_estimator=dr_grpo", "learner.loss_norm=constant",
                            "learner.hrr_weight=0"]).learner
    assert (lc.advantage_estimator, lc.loss_norm, lc.policy_loss) == ("dr_grpo", "constant", "ppo_clip")


def test_constant_norm_does_not_divide_by_the_trajectory_length():
    # 1 / (G L) = 1 / (4 * 100), whatever |o_i| or N
    assert token_weight(5, 4, 30, "constant", budget=100) == token_weight(50, 4, 300, "constant", budget=100) == 1 / 400
    with pytest.raises(ValueError, match="generation budget"):
        token_weight(5, 4, 30, "constant")


@pytest.mark.slow
@requires_deepspeed
def test_the_trainer_takes_the_registered_estimator_and_loss(tiny_model_dir, monkeypatch):
    """The defaults train exactly as the registered entries they name; a loss registered in a test is the one the
    step calls; Dr. GRPO (dr_grpo + constant) takes a finite step."""
    from ziprl.learner.losses.ppo_clip import policy_loss
    from ziprl.learner.trainer import Trainer

    groups = make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=2)
    calls = []

    def recorded(*args, **kwargs):
        calls.append(args[0].shape)
        return policy_loss(*args, **kwargs)

    LOSSES.names()
    monkeypatch.setitem(LOSSES._entries, "recorded", (50, recorded))
    default = Trainer(make_cfg(), tiny_model_dir).train_step(groups)
    named = Trainer(make_cfg(policy_loss="recorded", advantage_estimator="grpo"), tiny_model_dir).train_step(groups)
    assert calls
    assert all(named[k] == default[k] for k in ("loss", "grad_norm", "adv_mean", "hrr_abs_mean"))
    dr = Trainer(make_cfg(advantage_estimator="dr_grpo", loss_norm="constant"), tiny_model_dir).train_step(groups)
    assert math.isfinite(dr["loss"])
    assert dr["grad_norm"] > 0
