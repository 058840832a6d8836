"""benchmarks/hrr_credit.py: HRR's centred scores of trained trajectories and the share of their spread each property
of a turn explains."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import REPO
from ziprl.env.trajectory import Trajectory, Turn, save_trajectories

sys.path.insert(0, str(REPO / "benchmarks"))
import _common  # noqa: E402
import hrr_credit  # noqa: E402


def test_the_explained_share_is_the_between_group_share_of_variance():
    values = np.array([1.0, 1.0, -1.0, -1.0])
    assert hrr_credit.explained_share(values, ["a", "a", "b", "b"]) == pytest.approx(1.0)
    assert hrr_credit.explained_share(values, ["a"] * 4) == pytest.approx(0.0)
    # groups {1, -1} and {1, -1}: equal means, nothing explained; {1, 1, -1} (mean 1/3, squares 8/3 about it) and
    # {-1}: 1 - (8/3) / 4
    assert hrr_credit.explained_share(values, ["a", "b", "a", "b"]) == pytest.approx(0.0)
    assert hrr_credit.explained_share(values, ["a", "a", "a", "b"]) == pytest.approx(1 - (8 / 3) / 4)
    assert hrr_credit.explained_share(np.zeros(3), ["a", "b", "c"]) == 0.0


def _turn(action: str, q: float | None, level: int | None = 2, error: str | None = None) -> Turn:
    return Turn(action=action, q_com=q, level=level, format_error=error)


def test_turns_are_centred_as_hrr_centres_them_and_named_by_what_they_compressed():
    turns = [_turn("search", None), _turn("open", 0.9, level=4), _turn("invalid", 0.3, level=None, error="no tag"),
             _turn("answer", 0.6, level=1)]
    got = hrr_credit.scored_turns(turns)
    assert [round(t.centred, 6) for t in got] == [0.3, -0.3, 0.0]  # Q_bar = 0.6 over the scored turns
    assert [(t.compressed, t.level, t.malformed) for t in got] == [("search", 4, False), ("open", None, True),
                                                                    ("invalid", 1, False)]
    assert hrr_credit.scored_turns([_turn("search", None)]) == []


def _write_run(root, name: str, trajectories: list[list[Turn]]) -> None:
    trajs = [Trajectory(question_id=f"q{i}", question="?", answers=["a"], turns=t) for i, t in enumerate(trajectories)]
    save_trajectories(trajs, root / name / "trajectories" / "step_000001.parquet")


def test_the_report_pools_seeds_per_arm(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    runs = tmp_path / "runs"
    malformed = [_turn("search", None), _turn("invalid", 0.2, level=None, error="x"), _turn("open", 0.8, level=3)]
    for seed in (0, 1):
        _write_run(runs, f"w0.2_seed{seed}", [malformed])
    _write_run(runs, "w0_seed0", [[_turn("search", None), _turn("open", 0.5), _turn("answer", 0.7)]])
    (runs / "logs").mkdir()  # not a run
    hrr_credit.main(["--runs", str(runs), "--name", "credit"])
    rows = json.loads((tmp_path / "results" / "credit.json").read_text())["rows"]
    assert [(r["w"], r["seeds"], r["scored turns"], r["malformed turns"]) for r in rows] == [
        (0.0, "0", 2, 0), (0.2, "0,1", 4, 2)]
    assert rows[1]["their mean Q - Q_bar"] == pytest.approx(-0.3)
    assert rows[1]["share: own format error"] == pytest.approx(1.0)  # here the format error is the whole spread
    assert rows[0]["share: what it compressed"] == pytest.approx(1.0)
    assert "w=0.2: own format error 1.00" in capsys.readouterr().out


def test_a_directory_without_runs_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        hrr_credit.main(["--runs", str(tmp_path / "missing")])
    assert exc.value.code == 2
    assert "no w<w>_seed<s>/trajectories/step_*.parquet there" in capsys.readouterr().err
