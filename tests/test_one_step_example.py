"""``examples/one_step.py`` runs end to end: rollout -> advantages -> loss -> optimizer step -> weight push, its
update through the trainer's own step function (:func:`ziprl.learner.step.update_step`), not a copy of it."""

from __future__ import annotations

import math
import os
import re
import runpy
import subprocess
import sys

import pytest

from tests.conftest import REPO
from ziprl.learner import step


def test_one_step_example_runs_end_to_end(default_model_dir, monkeypatch, capsys):
    calls = []
    real = step.update_step
    monkeypatch.setattr(step, "update_step", lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    main = runpy.run_path(str(REPO / "examples" / "one_step.py"))["main"]
    assert main(["--questions", "2", "--group-size", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    out = {m[1]: float(m[2]) for line in printed if (m := re.fullmatch(r" *(\w+): (\S+)", line))}  # key: value
    assert len(calls) == 1  # the example's update is the trainer's step function
    assert out["trajectories"] == 4
    assert out["turns"] >= 4  # 2 questions x G = 2, at least one turn each
    assert math.isfinite(out["loss"])
    assert math.isfinite(out["grad_norm"])
    assert out["policy_version"] == 1
    assert out["engine_version"] == 1
    assert out["pushed_bytes"] > 0  # the engine took the pushed weights


@pytest.mark.parametrize(("args", "says"), [
    (["--questions", "0"], "--questions: '0': must be at least 1"),
    (["--group-size", "1"], "--group-size: '1': must be at least 2"),
    (["--questions", "two"], "'two' is not an integer"),
    (["--model", "/nonexistent/model"], "is not a local directory"),
])
def test_bad_arguments_are_one_error_line_and_exit_code_2_before_anything_loads(tmp_path, args, says):
    env = {**os.environ, "ZIPRL_CACHE": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, str(REPO / "examples" / "one_step.py"), *args], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, run.stderr
    assert says in errors[0]
    assert "Traceback" not in run.stderr
    assert list(tmp_path.iterdir()) == []  # no cache, no model, nothing written
