"""GRPO + HRR advantages of whole groups against hand-computed values."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ziprl.config import LearnerConfig
from ziprl.config.schema import HRR_REFERENCES
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.learner.advantages import carries_signal, compute_advantages, hrr_reference, hrr_turn_advantages
from ziprl.learner.advantages.grpo import grpo_advantages


def traj(group: str, reward: float, qs: list[float | None]) -> Trajectory:
    return Trajectory(question_id=group, question="q", answers=["a"], group_id=group, reward=reward,
                      turns=[Turn(q_com=q) for q in qs])  # fmt: skip


def test_grpo_population_std():
    # R = [1, 0, 0, 0]: mean 0.25; var = (0.75^2 + 3 * 0.25^2) / 4 = 0.1875; std = sqrt(3)/4 = 0.4330
    # A = 0.75 / 0.4330 = sqrt(3) = 1.7321 ; -0.25 / 0.4330 = -1/sqrt(3) = -0.5774
    a = grpo_advantages([1.0, 0.0, 0.0, 0.0], eps=0.0)
    np.testing.assert_allclose(a, [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])


def test_grpo_sample_std_and_eps():
    # ddof=1: var = 0.75 / 3 = 0.25, std = 0.5 -> A = 0.75 / 0.5 = 1.5 ; -0.25 / 0.5 = -0.5
    np.testing.assert_allclose(
        grpo_advantages([1.0, 0.0, 0.0, 0.0], eps=0.0, ddof=1), [1.5, -0.5, -0.5, -0.5]
    )
    # R = [1, 0]: mean 0.5, population std 0.5, eps 0.5 -> A = +-0.5 / (0.5 + 0.5) = +-0.5
    np.testing.assert_allclose(grpo_advantages([1.0, 0.0], eps=0.5), [0.5, -0.5])


@pytest.mark.parametrize("ddof", [0, 1])
def test_grpo_equal_rewards_and_size_one_are_exactly_zero(ddof):
    for rewards in ([0.1, 0.1, 0.1], [1.0, 1.0], [0.0] * 8, [0.7]):
        a = grpo_advantages(rewards, eps=1e-6, ddof=ddof)
        assert a.shape == (len(rewards),)
        assert np.all(a == 0.0)


def test_hrr_turns_with_and_without_q():
    # scored Q = 0.2, 0.8, 0.5 -> Q_bar = 1.5 / 3 = 0.5 ; w = 0.2
    # A = 0.5 + 0.2 * (0.2 - 0.5) = 0.44 ; None -> 0.5 ; 0.5 + 0.2 * 0.3 = 0.56 ; 0.5 + 0 = 0.5
    a = hrr_turn_advantages(0.5, [0.2, None, 0.8, 0.5], w=0.2)
    np.testing.assert_allclose(a, [0.44, 0.5, 0.56, 0.5])


def test_hrr_degenerate_cases():
    assert hrr_turn_advantages(-1.25, [0.1, 0.9, None], w=0.0) == [-1.25, -1.25, -1.25]  # w = 0: the estimator alone
    assert hrr_turn_advantages(0.3, [None, None], w=0.5) == [0.3, 0.3]  # no scored turn
    assert hrr_turn_advantages(0.3, [], w=0.5) == []
    assert hrr_turn_advantages(0.0, [0.9], w=1.0) == [0.0]  # one scored turn equals its own mean


def group(gid: str, *members: tuple[float, list[float | None]]) -> Group:
    return Group(tuple(traj(gid, reward, qs) for reward, qs in members))


def groups() -> list[Group]:
    return [
        group("g1", (1.0, [0.9, 0.5]), (0.0, [None, 0.2, 0.6])),  # R = [1, 0], mean 0.5, std 0.5 -> A = +-1 (eps = 0)
        group("g2", (1.0, [0.4, None]), (1.0, [0.6])),  # all rewards 1 -> zero variance, A = 0
        group("g3", (0.0, [0.3])),  # size 1 -> A = 0, zero variance
    ]


def test_a_group_follows_the_papers_equations():
    """G = 4, R = [1, 0, 1, 1], eps = 0, w = 0.2, by hand:
    Eq. GRPO advantage: mean 0.75, population std sqrt(0.1875) = sqrt(3)/4 -> A_i = (R_i - 0.75) / (sqrt(3)/4),
    i.e. 1/sqrt(3) for R = 1 and -sqrt(3) for R = 0.
    Eq. Q_bar: trajectory 0 scores [0.9, 0.3] -> 0.6; trajectory 1 [None, 0.2, 0.8] -> 0.5; 2 none; 3 [0.4] -> 0.4.
    Eq. advantage_adjust: A_ij = A_i + 0.2 (Q_ij - Q_bar_i); an unscored turn keeps A_i."""
    g = group("q", (1.0, [0.9, 0.3]), (0.0, [None, 0.2, 0.8]), (1.0, [None]), (1.0, [0.4]))
    res = compute_advantages([g], LearnerConfig(advantage_estimator="grpo", hrr_weight=0.2, adv_eps=0.0))
    up, down = 1 / math.sqrt(3), -math.sqrt(3)
    np.testing.assert_allclose(res.traj_advantages, [up, down, up, up])
    want = [[up + 0.06, up - 0.06], [down, down - 0.06, down + 0.06], [up], [up]]
    for got, w in zip(res.turn_advantages, want, strict=True):
        np.testing.assert_allclose(got, w, atol=1e-12)
    assert res.trajectories == list(g.trajectories)


def test_compute_advantages_hand_values_and_stats():
    res = compute_advantages(groups(), LearnerConfig(hrr_weight=0.5, adv_eps=0.0))
    assert [t.group_id for t in res.trajectories] == ["g1", "g1", "g2", "g2", "g3"]  # group after group, in order
    assert res.traj_advantages == [1.0, -1.0, 0.0, 0.0, 0.0]
    # g1/0: Q_bar = 0.7 -> 1 + 0.5 * 0.2 = 1.1 ; 1 + 0.5 * (-0.2) = 0.9
    # g1/1: Q_bar = 0.4 -> None -> -1 ; -1 + 0.5 * (-0.2) = -1.1 ; -1 + 0.5 * 0.2 = -0.9
    # g2/0: Q_bar = 0.4 -> 0 ; None -> 0
    # g2/1, g3: single scored turn -> 0
    expected = [[1.1, 0.9], [-1.0, -1.1, -0.9], [0.0, 0.0], [0.0], [0.0]]
    for got, want in zip(res.turn_advantages, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)
    s = res.stats
    assert s["zero_variance_frac"] == pytest.approx(2 / 3)  # g2, g3 of 3 groups
    assert (s["num_groups"], s["num_trajectories"], s["num_turns"]) == (3, 5, 9)
    # turn advantages sum: 1.1 + 0.9 - 1 - 1.1 - 0.9 = -1.0 over 9 turns
    assert s["adv_mean"] == pytest.approx(-1 / 9)
    # sum of squares = 1.21 + 0.81 + 1 + 1.21 + 0.81 = 5.04 ; var = 5.04/9 - (1/9)^2
    assert s["adv_std"] == pytest.approx(math.sqrt(5.04 / 9 - 1 / 81))
    # |HRR| = 0.1 (four turns) -> 0.4 / 9
    assert s["hrr_abs_mean"] == pytest.approx(0.4 / 9)


def test_drop_zero_variance_groups():
    res = compute_advantages(
        groups(), LearnerConfig(hrr_weight=0.5, adv_eps=0.0, drop_zero_variance_groups=True)
    )
    assert [t.group_id for t in res.trajectories] == ["g1", "g1"]
    assert res.traj_advantages == [1.0, -1.0]
    s = res.stats
    assert s["zero_variance_frac"] == pytest.approx(2 / 3)  # measured before dropping
    assert (s["num_groups"], s["num_trajectories"], s["num_turns"]) == (1, 2, 5)


def test_drop_everything_gives_empty_result():
    res = compute_advantages([group("g", (1.0, [0.5]), (1.0, [0.1]))], LearnerConfig(drop_zero_variance_groups=True))
    assert res.trajectories == []
    assert res.turn_advantages == []
    assert res.stats["zero_variance_frac"] == 1.0
    assert res.stats["num_turns"] == 0


def test_w_zero_equals_plain_grpo():
    res = compute_advantages(groups(), LearnerConfig(hrr_weight=0.0))
    for t, a, turns in zip(res.trajectories, res.traj_advantages, res.turn_advantages, strict=True):
        assert turns == [a] * len(t.turns)
    assert res.stats["hrr_abs_mean"] == 0.0


def test_a_group_carries_signal_when_its_rewards_or_with_hrr_its_turns_differ():
    same_reward = group("g", (1.0, [0.2, 0.8]), (1.0, [0.5, None]))
    assert not carries_signal(same_reward, w=0.0)  # GRPO: nothing to learn
    assert carries_signal(same_reward, w=0.2)  # HRR: the first trajectory's turns differ in Q_com
    flat = group("g", (0.0, [0.4, 0.4, None]), (0.0, [0.9]), (0.0, []))  # no trajectory's scored turns differ
    assert not carries_signal(flat, w=0.2)
    assert carries_signal(group("g", (1.0, [0.4]), (0.0, [0.4])), w=0.0)


MEMBERS = st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]),
                             st.lists(st.one_of(st.none(), st.sampled_from([0.1, 0.3, 0.7])), min_size=1, max_size=4)),
                   min_size=1, max_size=4)


@given(MEMBERS, st.sampled_from([0.0, 0.2, -0.2, 1.0]), st.sampled_from(HRR_REFERENCES))
def test_carries_signal_is_whether_some_turn_gets_a_non_zero_advantage(members, w, reference):
    g = group("g", *members)
    turns = compute_advantages([g], LearnerConfig(hrr_weight=w, hrr_reference=reference)).turn_advantages
    assert carries_signal(g, w) == any(abs(a) > 1e-9 for t in turns for a in t)


def test_the_causal_reference_is_the_mean_of_the_scored_turns_so_far():
    # scored Q = 0.2, 0.8, 0.5: running means 0.2, 0.5, 0.5 ; w = 0.2
    # A = 0.5 + 0.2 * 0 = 0.5 ; None -> 0.5 ; 0.5 + 0.2 * (0.8 - 0.5) = 0.56 ; 0.5 + 0.2 * (0.5 - 0.5) = 0.5
    assert hrr_reference([0.2, None, 0.8, 0.5], "causal") == [0.2, None, 0.5, 0.5]
    assert hrr_reference([0.2, None, 0.8, 0.5]) == [0.5, None, 0.5, 0.5]  # the paper's: one mean for every turn
    np.testing.assert_allclose(hrr_turn_advantages(0.5, [0.2, None, 0.8, 0.5], 0.2, "causal"), [0.5, 0.5, 0.56, 0.5])
    with pytest.raises(ValueError, match="hrr reference must be one of"):
        hrr_reference([0.1], "future")


@given(st.lists(st.one_of(st.none(), st.floats(0, 1)), max_size=6), st.floats(0, 1))
def test_under_the_causal_reference_a_turns_term_ignores_every_later_score(q_turns, later):
    """The property that makes it causal: changing what comes after a turn leaves that turn's advantage alone."""
    a = hrr_turn_advantages(0.3, q_turns, 0.2, "causal")
    b = hrr_turn_advantages(0.3, [*q_turns, later], 0.2, "causal")
    assert b[:len(a)] == pytest.approx(a)
    paper = hrr_turn_advantages(0.3, [*q_turns, later], 0.2)  # the paper's reference moves with the later score
    scored = [q for q in q_turns if q is not None]
    if scored and abs(later - sum(scored) / len(scored)) > 1e-6:
        assert paper[:len(a)] != pytest.approx(hrr_turn_advantages(0.3, q_turns, 0.2))


def test_compute_advantages_uses_the_configured_reference():
    g = group("g", (1.0, [0.2, 0.8]), (0.0, [0.6, 0.6]))
    paper = compute_advantages([g], LearnerConfig(hrr_weight=1.0, adv_eps=0.0)).turn_advantages
    causal = compute_advantages([g], LearnerConfig(hrr_weight=1.0, adv_eps=0.0, hrr_reference="causal")).turn_advantages
    np.testing.assert_allclose(paper, [[1.0 - 0.3, 1.0 + 0.3], [-1.0, -1.0]])
    np.testing.assert_allclose(causal, [[1.0, 1.0 + 0.3], [-1.0, -1.0]])
