"""`python -m ziprl.eval` end to end: every strategy's report, trajectories and plots, and a bad strategy refused
before any model loads (the statistics themselves: tests/env/test_stats.py)."""

from __future__ import annotations

import json

import pytest

from ziprl.env.trajectory import load_trajectories
from ziprl.plots import tokens_per_turn
from ziprl.registry import STRATEGIES


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
    assert report["questions"] == 2
    assert set(report["results"]) == set(STRATEGIES)
    for strategy, r in report["results"].items():
        assert r["trajectories"] == 4, strategy
        assert r["turns"] == 3, strategy
        assert r["finish_rate"] == 0, strategy
        assert r["format_error_rate"] == 1.0
        assert r["em"] == 0
        assert r["searches"] == 0
        trajs = load_trajectories(out / f"trajectories_{strategy}.parquet")
        assert len(trajs) == 4
        assert all(t.strategy == strategy for t in trajs)
    react = tokens_per_turn(load_trajectories(out / "trajectories_react.parquet"))[1]
    adaptive = tokens_per_turn(load_trajectories(out / "trajectories_adaptive.parquet"))[1]
    assert react[2] > react[0]
    assert adaptive[2] - adaptive[0] < react[2] - react[0]
    md = (out / "report.md").read_text()
    assert md.count("\n| ") == 1 + len(STRATEGIES)
    assert "format errors/turn" in md  # header + a row per strategy
    for png in ("tokens_per_turn.png", "levels.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_cli_rejects_unknown_strategy_before_loading(capsys):
    from ziprl.cli.eval import main

    assert main(["--strategy", "adaptive,magic"]) == 2
    assert "unknown strategy ['magic']" in capsys.readouterr().err
