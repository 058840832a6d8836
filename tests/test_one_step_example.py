"""``examples/one_step.py`` runs end to end: rollout -> advantages -> loss -> optimizer step -> weight push, its
update through the trainer's own step function (:func:`ziprl.learner.step.update_step`), not a copy of it."""

from __future__ import annotations

import math
import runpy

from tests.conftest import REPO
from ziprl.learner import step


def test_one_step_example_runs_end_to_end(default_model_dir, monkeypatch):
    calls = []
    real = step.update_step
    monkeypatch.setattr(step, "update_step", lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    main = runpy.run_path(str(REPO / "examples" / "one_step.py"))["main"]
    out = main(["--questions", "2", "--group-size", "2"])
    assert len(calls) == 1  # the example's update is the trainer's step function
    assert out["trajectories"] == 4
    assert out["turns"] >= 4  # 2 questions x G = 2, at least one turn each
    assert math.isfinite(out["loss"])
    assert math.isfinite(out["grad_norm"])
    assert out["policy_version"] == 1
    assert out["engine_version"] == 1
    assert out["pushed_bytes"] > 0  # the engine took the pushed weights
