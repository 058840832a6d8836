"""benchmarks/scale_sim.py: every ``--runs`` pair, every launch's config and inputs, and every run directory a launch
replaces are checked before the first launch; bad input exits 2 and changes no file. No test here launches."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ziprl.outputs import write_marker
from ziprl.testing.outputs import digests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _common  # noqa: E402
import scale_sim  # noqa: E402

SAMPLE = ["--dataset", "sample"]  # checked in a second, where pooled loads 6,850 passages' questions


def refuse(*args, **kwargs):
    raise AssertionError("scale_sim launched, or built its model, on input it should have refused")


@pytest.fixture
def sim(tmp_path, monkeypatch):
    """Runs and results under ``tmp_path`` (an earlier marked run and earlier results in them); no launch."""
    monkeypatch.setattr(scale_sim, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(sys, "argv", ["benchmarks/scale_sim.py"])
    monkeypatch.setattr(scale_sim, "launch_once", refuse)
    monkeypatch.setattr(scale_sim, "tiny_qwen3", refuse)
    earlier = tmp_path / "runs" / "scale_sim_s1_object_store"
    write_marker(earlier, "run")
    (earlier / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "scale_sim.json").write_text(json.dumps({"rows": [{"step": 1}], "command":
                                                                     "python benchmarks/scale_sim.py"}))
    return tmp_path


def refused(argv: list[str], capsys) -> str:
    """Run scale_sim on ``argv``; its exit status must be 2; returns stderr."""
    with pytest.raises(SystemExit) as exc:
        sys.exit(scale_sim.main([*SAMPLE, *argv]))
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("runs", "said"), [
    ("1:object_store,2", "'2' is not max_staleness:transport"),
    ("1:object_store,x:collective", "'x:collective' is not max_staleness:transport"),
    ("1:object_store,1:object_store", "'1:object_store' is given twice"),
    ("1:object_store,0:nosuch", "weights.transport must be"),
])
def test_a_bad_runs_pair_exits_2_before_the_first_launch_and_changes_nothing(sim, capsys, runs, said):
    before = digests(sim)
    assert said in refused(["--runs", runs], capsys)
    assert digests(sim) == before


def test_a_missing_index_dir_exits_2_and_keeps_the_earlier_run(sim, capsys):
    before = digests(sim)
    assert "retriever.index_dir" in refused(["--runs", "1:object_store", "--index-dir", str(sim / "nosuch")], capsys)
    assert digests(sim) == before


def test_a_run_directory_a_later_launch_would_replace_is_checked_before_the_first(sim, capsys):
    """The second launch's directory is a user's: refused before the first launch deletes the earlier run."""
    mine = sim / "runs" / "scale_sim_s0_collective"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    before = digests(sim)
    assert "has no .ziprl-run marker" in refused(["--runs", "1:object_store,0:collective"], capsys)
    assert digests(sim) == before


def test_the_launches_replace_their_earlier_runs_and_write_one_row_per_step(sim, monkeypatch):
    step = {"step": 1, **{f"system/{k}": 0.0 for k in ("groups_generated", "groups_trained", "groups_dropped_stale",
                                                         "groups_buffered", "actor_idle_frac", "learner_wait_frac",
                                                         "rollout_failures")},
            **{f"perf/{k}_seconds": 1.0 for k in ("step", "wait", "train", "push", "save", "weight_push")},
            "perf/weight_push_bytes": 1e6, "rollout/turns": 2.0, "rollout/prompt_tokens_per_turn": 30.0}

    def launch(cfg) -> float:
        (Path(cfg.run.out_dir) / "metrics.jsonl").write_text(json.dumps(step) + "\n")
        return 1.0

    monkeypatch.setattr(scale_sim, "tiny_qwen3", lambda path: path)
    monkeypatch.setattr(scale_sim, "launch_once", launch)
    assert scale_sim.main([*SAMPLE, "--runs", "1:object_store,0:collective"]) == 0
    rows = json.loads((sim / "results" / "scale_sim.json").read_text())["rows"]
    assert [(r["max_staleness"], r["transport"]) for r in rows] == [(1, "object_store"), (0, "collective")]
    assert json.loads((sim / "runs" / "scale_sim_s1_object_store" / "metrics.jsonl").read_text()) == step


@pytest.mark.parametrize("part", ["_memory", "_totals"])
def test_a_name_whose_derived_results_another_script_wrote_exits_2_before_anything_is_written(sim, capsys, part):
    """scale_sim.py writes <name>, <name>_memory and <name>_totals after each launch: each is checked when the
    arguments are parsed, not after the first launch wrote <name>.json."""
    (sim / "results" / f"scale_sim{part}.json").write_text(json.dumps({"rows": [], "command":
                                                                       "python benchmarks/gpu_step.py"}))
    before = digests(sim)
    err = refused(["--runs", "1:object_store"], capsys)
    assert f"argument --name: 'scale_sim{part}':" in err and "hold the results of gpu_step.py" in err
    assert digests(sim) == before
