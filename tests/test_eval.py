"""The evaluation harness: behaviour statistics (hand-computed) and `python -m ziprl.eval` end to end."""

from __future__ import annotations

import json

import pytest

from ziprl.env.stats import trajectory_stats
from ziprl.env.trajectory import Trajectory, Turn, load_trajectories
from ziprl.plots import tokens_per_turn
from ziprl.registry import STRATEGIES


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
    assert s["trajectories"] == 2 and s["em"] == 0.5 and s["f1"] == 0.75 and s["reward"] == 0.5
    assert s["finish_rate"] == 0.5 and s["turns"] == 2.5
    assert s["searches"] == 1.0 and s["opens"] == 0.5  # per question: (1 + 1) / 2 and (1 + 0) / 2
    assert s["format_error_rate"] == pytest.approx(1 / 5)
    assert s["prompt_tokens_per_turn"] == pytest.approx(110 / 5) and s["response_tokens_per_turn"] == 5
    assert s["tokens_per_trajectory"] == pytest.approx((75 + 60) / 2)
    assert s["q_com"] == pytest.approx(0.6) and s["scored_turn_fraction"] == pytest.approx(2 / 5)
    # levels of well-formed turns only (the invalid turn's level 5 is not a choice that was applied)
    assert [s[f"level_{g}_frac"] for g in range(1, 6)] == [0.25, 0.25, 0.5, 0.0, 0.0]
    assert tokens_per_turn(TRAJS) == ([1, 2, 3], [10.0, 30.0, 30.0])


def test_empty_batch_gives_zeros():
    s = trajectory_stats([])
    assert s["trajectories"] == 0 and s["em"] == 0 and s["level_3_frac"] == 0


@pytest.mark.slow
def test_eval_cli_all_strategies(tiny_model_dir, tmp_path):
    """A random tiny model writes no protocol: every turn is a format error, every episode runs out of turns,
    and react's prompt grows with the turns while adaptive's does not."""
    from ziprl.cli.eval import main

    out = tmp_path / "eval"
    rc = main(["--strategy", "all", "--model", str(tiny_model_dir), "--limit", "2", "--max-turns", "3",
               "--samples", "2", "--out", str(out), "--set", "sampling.max_new_tokens=8", "--set", "model.device=cpu"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["questions"] == 2 and set(report["results"]) == set(STRATEGIES)
    for strategy, r in report["results"].items():
        assert r["trajectories"] == 4 and r["turns"] == 3 and r["finish_rate"] == 0, strategy
        assert r["format_error_rate"] == 1.0 and r["em"] == 0 and r["searches"] == 0
        trajs = load_trajectories(out / f"trajectories_{strategy}.parquet")
        assert len(trajs) == 4 and all(t.strategy == strategy for t in trajs)
    react = tokens_per_turn(load_trajectories(out / "trajectories_react.parquet"))[1]
    adaptive = tokens_per_turn(load_trajectories(out / "trajectories_adaptive.parquet"))[1]
    assert react[2] > react[0] and adaptive[2] - adaptive[0] < react[2] - react[0]
    md = (out / "report.md").read_text()
    assert md.count("\n| ") == 1 + len(STRATEGIES) and "format errors/turn" in md  # header + a row per strategy
    for png in ("tokens_per_turn.png", "levels.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_cli_rejects_unknown_strategy_before_loading(capsys):
    from ziprl.cli.eval import main

    assert main(["--strategy", "adaptive,magic"]) == 2
    assert "unknown strategy ['magic']" in capsys.readouterr().err
