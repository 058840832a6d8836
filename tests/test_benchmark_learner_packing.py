"""benchmarks/learner_packing.py: the tokens it counts per layout, and its arguments checked before any work."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from tests.conftest import REPO
from ziprl.learner.batch import TurnRow, collate

sys.path.insert(0, str(REPO / "benchmarks"))
import learner_packing  # noqa: E402


def test_the_linear_layers_tokens_count_padding_unless_packed_and_shared_prompt_tokens_once_in_a_tree():
    rows = [TurnRow([1, 2, 3, 4, 5, 6], 4, [0.0] * 2, 1.0, 1.0, 0), TurnRow([1, 2, 3, 7], 3, [0.0], 1.0, 1.0, 1)]
    mb = collate(rows, 0, 2)  # 2 prefix tokens, then 4 and 2 own tokens; the second row's prompt token 3 is the first's
    assert learner_packing.linear_tokens([(mb, True)]) == 2 + 2 * 4
    assert learner_packing.linear_tokens([(dataclasses.replace(mb, packed=True), True)]) == 2 + 4 + 2
    assert learner_packing.linear_tokens([(dataclasses.replace(mb, packed=True, share_rows=True), True)]) == 2 + 4 + 1
    assert learner_packing.linear_tokens([(mb, True), (mb, True)]) == 2 * (2 + 2 * 4)
    assert set(learner_packing.LAYOUTS) == {"padded", "packed", "tree"}


@pytest.mark.parametrize(("args", "says"), [
    (["--trajectories", "nowhere.parquet"], "nowhere.parquet (no such file)"),
    (["--trajectories", "x.parquet"], "x.parquet (not a Parquet file"),
    (["--trajectories", "other.parquet"], "other.parquet (a Parquet file, but not of trajectories)"),
    (["--trajectories", "x.parquet", "--reps", "0"], "argument --reps: '0': must be at least 1"),
    (["--trajectories", "x.parquet", "--groups", "-1"], "argument --groups: '-1': must be at least 0"),
    (["--trajectories", "x.parquet", "--name", "../x"], "--name"),
    (["--trajectories", "step.parquet", "--config", "nowhere.yaml"], "error: --config: config file nowhere.yaml"),
    (["--trajectories", "step.parquet", "--model", "nowhere"], "argument --model: 'nowhere' is not a directory"),
])
def test_bad_arguments_exit_2_before_any_work(args, says, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ziprl.env.trajectory import Trajectory, save_trajectories

    (tmp_path / "x.parquet").write_bytes(b"")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "other.parquet")
    save_trajectories([Trajectory(question_id="q", question="?", answers=["a"], turns=[])], tmp_path / "step.parquet")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learner_packing.py"), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
