"""benchmarks/qcom_shift.py: an arm's Q_com against GRPO's, split exactly into malformed turns, the cell mix and the
quality within cells, and by Q_com's four parts."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from ziprl.env.trajectory import Trajectory, Turn, save_trajectories

sys.path.insert(0, str(REPO / "benchmarks"))
import _common  # noqa: E402
import qcom_shift  # noqa: E402
from qcom_shift import Scored  # noqa: E402

ALPHA = (0.3, 0.1, 0.4, 0.2)


def _s(cell, q: float) -> Scored:
    return Scored(cell, q, (q, q, q, q), 10)


def test_a_changed_mix_is_mix_and_a_changed_score_is_quality():
    a = [_s(("search", 2), 0.4), _s(("open", 4), 0.8)]
    b = [_s(("search", 2), 0.4), _s(("open", 4), 0.8), _s(("open", 4), 0.8), _s(("open", 4), 0.8)]
    got = qcom_shift.shift_share(a, b)
    assert got["delta"] == pytest.approx(0.1)
    assert (got["malformed"], got["mix"], got["quality"]) == pytest.approx((0.0, 0.1, 0.0))
    better = [_s(("search", 2), 0.6), _s(("open", 4), 0.8)]
    got = qcom_shift.shift_share(a, better)
    assert (got["delta"], got["malformed"], got["mix"], got["quality"]) == pytest.approx((0.1, 0.0, 0.0, 0.1))


def test_more_malformed_turns_count_as_malformed_and_a_new_cell_only_as_mix():
    a = [_s(("search", 2), 0.6), _s(("search", 2), 0.6)]
    b = [_s(("search", 2), 0.6), _s(None, 0.0)]
    got = qcom_shift.shift_share(a, b)
    assert (got["delta"], got["malformed"], got["mix"], got["quality"]) == pytest.approx((-0.3, -0.3, 0.0, 0.0))
    c = [_s(("search", 2), 0.6), _s(("search", 4), 0.2)]
    got = qcom_shift.shift_share(a, c)
    assert (got["delta"], got["mix"], got["quality"]) == pytest.approx((-0.2, -0.2, 0.0))


cells = st.sampled_from([None, ("search", 2), ("search", 4), ("open", 2), ("invalid", 3)])
turn_lists = st.lists(st.builds(_s, cells, st.floats(0, 1)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(turn_lists, turn_lists)
def test_the_three_terms_and_the_four_parts_sum_to_the_difference(a, b):
    got = qcom_shift.shift_share(a, b)
    assert got["malformed"] + got["mix"] + got["quality"] == pytest.approx(got["delta"], abs=1e-9)
    parts = qcom_shift.part_deltas(a, b, (0.25,) * 4)  # here every part equals Q, so alphas summing to 1 give Q
    assert sum(parts.values()) == pytest.approx(got["delta"], abs=1e-9)


def _turn(action: str, q: float | None, level: int | None = 2, error: str | None = None) -> Turn:
    parts = {} if q is None else {"q_ratio": q, "q_level": q, "q_info": q, "q_sem": q}
    return Turn(action=action, q_com=q, level=level, format_error=error, response_text="x" * 20, **parts)


def _write_run(root, name: str, steps: dict[int, list[list[Turn]]]) -> None:
    (root / name).mkdir(parents=True)
    scoring = dict(zip(("w_ratio", "w_level", "w_info", "w_sem"), ALPHA, strict=True))
    (root / name / "config.json").write_text(json.dumps({"env": {"scoring": scoring}}))
    for step, trajectories in steps.items():
        trajs = [Trajectory(question_id=f"q{i}", question="?", answers=["a"], turns=t)
                 for i, t in enumerate(trajectories)]
        save_trajectories(trajs, root / name / "trajectories" / f"step_{step:06d}.parquet")


def test_each_arm_is_compared_with_its_seeds_grpo_run_per_window(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    runs = tmp_path / "runs"
    good = [_turn("search", None), _turn("open", 0.5, level=2), _turn("answer", 0.5, level=2)]
    better = [_turn("search", None), _turn("open", 0.7, level=2), _turn("answer", 0.7, level=2)]
    _write_run(runs, "w0_seed0", {1: [good], 2: [good], 3: [good]})
    _write_run(runs, "w0.2_seed0", {1: [better], 2: [good], 3: [better], 4: [better]})  # step 4: GRPO lacks it
    _write_run(runs, "w0.2_seed1", {1: [better]})  # no GRPO run of seed 1
    (runs / "logs").mkdir()  # not a run
    qcom_shift.main(["--runs", str(runs), "--window", "2", "--name", "shift"])
    rows = json.loads((tmp_path / "results" / "shift.json").read_text())["rows"]
    assert [(r["seed"], r["w"], r["steps"]) for r in rows] == [(0, 0.2, "1-2"), (0, 0.2, "3-3")]
    assert [r["quality"] for r in rows] == pytest.approx([0.1, 0.2])
    assert rows[1]["part: info"] == pytest.approx(0.4 * 0.2)
    assert "seed 0 w=0.2 steps 1-2: +0.100 = malformed +0.000 + mix +0.000 + quality +0.100" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--window", "0"], []])
def test_bad_input_is_refused_with_exit_2(tmp_path, capsys, monkeypatch, args):
    monkeypatch.setattr(sys, "argv", [str(REPO / "benchmarks" / "qcom_shift.py")])  # its default name's results are its own
    with pytest.raises(SystemExit) as exc:
        qcom_shift.main(["--runs", str(tmp_path / "missing"), *args])
    assert exc.value.code == 2
    assert ("--window must be > 0" if args else "no w0_seed<s> run") in capsys.readouterr().err
