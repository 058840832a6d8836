"""``examples/one_step.py`` runs end to end: rollout -> advantages -> loss -> optimizer step -> weight push."""

from __future__ import annotations

import math
import runpy

from tests.conftest import REPO


def test_one_step_example_runs_end_to_end(default_model_dir):
    main = runpy.run_path(str(REPO / "examples" / "one_step.py"))["main"]
    out = main(["--questions", "2", "--group-size", "2"])
    assert out["trajectories"] == 4 and out["turns"] >= 4  # 2 questions x G = 2, at least one turn each
    assert math.isfinite(out["loss"]) and math.isfinite(out["grad_norm"])
    assert out["engine_version"] == 1 and out["pushed_bytes"] > 0  # the engine took the pushed weights
