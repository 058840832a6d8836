"""benchmarks/hrr_credit.py: HRR's centred scores of trained trajectories and the share of their spread each property
of a turn explains."""

from __future__ import annotations

import dataclasses
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


def test_a_turns_credit_splits_into_its_own_score_the_past_and_the_future():
    turns = [_turn("search", None), _turn("search", 0.6, level=4), _turn("open", 0.9, level=2),
             _turn("open", 0.3, level=4), _turn("answer", 0.6, level=4)]
    got = hrr_credit.scored_turns(turns)
    for t in got:
        assert t.centred == pytest.approx((1 - 1 / 4) * t.q + t.past + t.future)
    assert [round(t.past, 6) for t in got] == [0.0, -0.15, -0.375, -0.45]
    assert [round(t.future, 6) for t in got] == [-0.45, -0.225, -0.15, 0.0]
    assert [t.later_same_level for t in got] == [pytest.approx(2 / 3), 0.0, 1.0, None]
    assert [t.later_q for t in got] == [pytest.approx(0.6), pytest.approx(0.45), pytest.approx(0.6), None]
    assert [t.position for t in got] == ["1 of 4", "2 of 4", "3 of 4", "4 of 4"]
    rows = hrr_credit.cell_rows(0.2, got + [dataclasses.replace(got[0], compressed="invalid")], min_turns=1)
    assert [(r["compressed"], r["level"], r["turns"]) for r in rows] == [("open", 4, 2), ("search", 2, 1),
                                                                        ("search", 4, 1)]
    assert rows[0]["future"] == pytest.approx(-0.075) and rows[0]["later turns at this level"] == 1.0
    assert rows[2]["future"] == pytest.approx(-0.45) and rows[2]["later turns at this level"] == pytest.approx(2 / 3)
    assert [r["turns"] for r in hrr_credit.cell_rows(0.2, got, min_turns=2)] == [2]
    short = hrr_credit.scored_turns([_turn("search", None), _turn("search", 0.7, level=4), _turn("open", 0.5)])
    first = [r for r in hrr_credit.cell_rows(0.2, short, min_turns=1) if r["position"] == "1 of 2"]
    assert [(r["compressed"], r["level"], r["past"]) for r in first] == [("search", 4, 0.0)]
    assert first[0]["future"] == pytest.approx(-0.25) and first[0]["later turns' mean Q"] == pytest.approx(0.5)


def _write_run(root, name: str, trajectories: list[list[Turn]], step: int = 1) -> None:
    trajs = [Trajectory(question_id=f"q{i}", question="?", answers=["a"], turns=t) for i, t in enumerate(trajectories)]
    save_trajectories(trajs, root / name / "trajectories" / f"step_{step:06d}.parquet")


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
    cells = json.loads((tmp_path / "results" / "credit_cells.json").read_text())["rows"]
    assert cells == []  # fewer than 20 turns a cell
    _write_run(runs, "w0_seed0", [[_turn("search", None), _turn("open", 0.9), _turn("answer", 0.1)]], step=2)
    hrr_credit.main(["--runs", str(runs), "--name", "credit", "--max-step", "1"])
    rows = json.loads((tmp_path / "results" / "credit.json").read_text())["rows"]
    assert rows[0]["scored turns"] == 2  # step 2 not read


@pytest.mark.parametrize("args, message", [([], "no w<w>_seed<s>/trajectories/step_*.parquet there"),
                                           (["--max-step", "0"], "argument --max-step: '0': must be at least 1"),
                                           (["--max-step", "x"], "argument --max-step: 'x' is not an integer")])
def test_bad_input_is_refused_with_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.setattr(sys, "argv", [str(REPO / "benchmarks" / "hrr_credit.py")])  # its default name's results are its own
    with pytest.raises(SystemExit) as exc:
        hrr_credit.main(["--runs", str(tmp_path / "missing"), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"not parquet", b""], ids=["text", "empty"])
def test_a_step_file_that_is_not_parquet_exits_2_naming_it_before_anything_is_written(tmp_path, capsys, monkeypatch,
                                                                                       content):
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    runs = tmp_path / "runs"
    _write_run(runs, "w0_seed0", [[_turn("search", None), _turn("open", 0.5), _turn("answer", 0.7)]])
    bad = runs / "w0.2_seed0" / "trajectories" / "step_000001.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        hrr_credit.main(["--runs", str(runs), "--name", "credit"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --runs: {bad} is not a trajectory file" in err and "give another --runs" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "results").exists()


def test_a_name_whose_cells_results_another_script_wrote_is_refused_before_anything_is_written(tmp_path, capsys,
                                                                                               monkeypatch):
    """hrr_credit.py writes <name> and <name>_cells: both are checked when the arguments are parsed, so it never
    writes the first and then refuses the second."""
    from ziprl.testing.outputs import digests

    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "credit_cells.json").write_text(json.dumps({"rows": [], "command":
                                                                        "python benchmarks/learning.py"}))
    monkeypatch.setattr(sys, "argv", [str(REPO / "benchmarks" / "hrr_credit.py")])
    runs = tmp_path / "runs"
    _write_run(runs, "w0_seed0", [[_turn("search", None), _turn("open", 0.5), _turn("answer", 0.7)]])
    before = digests(tmp_path / "results")
    with pytest.raises(SystemExit) as exc:
        hrr_credit.main(["--runs", str(runs), "--name", "credit"])
    assert exc.value.code == 2
    assert "argument --name: 'credit_cells':" in capsys.readouterr().err
    assert digests(tmp_path / "results") == before
