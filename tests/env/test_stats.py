"""Behaviour statistics of trajectories (ziprl/env/stats.py), hand-computed."""

from __future__ import annotations

import pytest

from ziprl.env.stats import trajectory_stats
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.plots import tokens_per_turn


def _turn(action: str, level=None, q=None, prompt=10, response=5, error=None) -> Turn:
    return Turn(action=action, level=level, q_com=q, q_ratio=q, q_level=q, q_info=q, q_sem=q, format_error=error,
                prompt_tokens=prompt, response_tokens=response)


TRAJS = [
    Trajectory("a", "q", ["x"], reward=1.0, em=1.0, f1=1.0, finished=True, turns=[
        _turn("search", level=1, prompt=10), _turn("open", level=3, q=0.5, prompt=20),
        _turn("answer", level=3, q=0.7, prompt=30)]),
    Trajectory("b", "q", ["x"], reward=0.0, em=0.0, f1=0.5, finished=False, turns=[
        _turn("invalid", level=5, error="no action", prompt=10), _turn("search", level=2, prompt=40)]),
]


def test_trajectory_stats_hand_computed():
    s = trajectory_stats(TRAJS)
    assert s["trajectories"] == 2
    assert s["em"] == 0.5
    assert s["f1"] == 0.75
    assert s["reward"] == 0.5
    assert s["finish_rate"] == 0.5
    assert s["turns"] == 2.5
    assert s["searches"] == 1.0
    assert s["opens"] == 0.5  # per question: (1 + 1) / 2 and (1 + 0) / 2
    assert s["format_error_rate"] == pytest.approx(1 / 5)
    assert s["prompt_tokens_per_turn"] == pytest.approx(110 / 5)
    assert s["response_tokens_per_turn"] == 5
    assert s["tokens_per_trajectory"] == pytest.approx((75 + 60) / 2)
    assert s["q_com"] == pytest.approx(0.6)
    assert s["scored_turn_fraction"] == pytest.approx(2 / 5)
    # levels of well-formed turns only (the invalid turn's level 5 is not a choice that was applied)
    assert [s[f"level_{g}_frac"] for g in range(1, 6)] == [0.25, 0.25, 0.5, 0.0, 0.0]
    assert tokens_per_turn(TRAJS) == ([1, 2, 3], [10.0, 30.0, 30.0])


def test_empty_batch_gives_zeros():
    s = trajectory_stats([])
    assert s["trajectories"] == 0
    assert s["em"] == 0
    assert s["level_3_frac"] == 0
