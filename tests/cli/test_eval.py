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


def _stop_at(module, n: int, ran: list[str], monkeypatch):
    """``module.run_strategy`` recording the strategies it rolls out (and the noise level), Ctrl-C on the ``n``-th."""
    real = module.run_strategy

    def run_strategy(cfg, strategy, *args, **kwargs):
        ran.append(f"{strategy}@{cfg.env.retrieval_noise:g}")
        if len(ran) == n:
            raise KeyboardInterrupt
        return real(cfg, strategy, *args, **kwargs)

    monkeypatch.setattr(module, "run_strategy", run_strategy)


EVAL_ARGS = ["--limit", "2", "--max-turns", "2", "--samples", "1", "--set", "sampling.max_new_tokens=4",
             "--set", "model.device=cpu"]


@pytest.mark.slow
def test_a_stopped_eval_resumes_rolling_out_only_what_it_lacks(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Stopped (Ctrl-C) during its third strategy, the eval keeps the two it measured in report.json; ``--resume``
    asking for the third alone rolls out only it, and the report holds all three, the first two's numbers unchanged.
    Other settings, a directory with nothing to continue, or --resume with --overwrite are one error each (exit 2),
    nothing touched."""
    from ziprl.cli.eval import main
    from ziprl.evaluation import harness

    out, ran = tmp_path / "eval", []
    args = ["--strategy", "adaptive,react,window", "--model", str(tiny_model_dir), "--out", str(out), *EVAL_ARGS]
    _stop_at(harness, 3, ran, monkeypatch)
    assert main(args) == 130
    first = json.loads((out / "report.json").read_text())["results"]
    assert list(first) == ["adaptive", "react"] and not (out / "trajectories_window.parquet").exists()

    def no_model(*a, **k):
        raise AssertionError("a model was loaded")

    with monkeypatch.context() as m:
        m.setattr("ziprl.policy.make_engine", no_model)
        assert main([*args, "--resume", "--limit", "3"]) == 2
        assert "data.limit 2 then, 3 now" in capsys.readouterr().err
        assert main([*args, "--resume", "--overwrite"]) == 2
        assert main([*args[:-len(EVAL_ARGS) - 2], "--out", str(tmp_path / "new"), *EVAL_ARGS, "--resume"]) == 2
        assert "holds nothing to continue" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["results"] == first

    ran.clear()  # resumed asking for the missing strategy only: the report keeps the two measured before
    assert main(["--strategy", "window", *args[2:], "--resume"]) == 0
    assert ran == ["window@0"]
    report = json.loads((out / "report.json").read_text())["results"]
    assert list(report) == ["adaptive", "react", "window"]
    assert {k: report[k] for k in first} == first
    assert (out / "report.md").read_text().count("\n| ") == 4  # header + three strategies
    assert (out / "levels.png").is_file() and (out / "trajectories_window.parquet").is_file()

    ran.clear()
    assert main([*args, "--resume"]) == 0
    assert ran == []
    assert json.loads((out / "report.json").read_text())["results"] == report


@pytest.mark.slow
def test_a_stopped_noise_sweep_resumes_with_the_cells_it_lacks(tiny_model_dir, tmp_path, monkeypatch):
    from ziprl.cli.eval import main
    from ziprl.evaluation import noise

    out, ran = tmp_path / "sweep", []
    args = ["--noise", "0,1", "--strategy", "adaptive,react", "--model", str(tiny_model_dir), "--out", str(out),
            *EVAL_ARGS]
    _stop_at(noise, 3, ran, monkeypatch)
    assert main(args) == 130
    first = json.loads((out / "noise.json").read_text())["results"]
    assert sorted(first["adaptive"]) == ["0", "1"] and "react" not in first
    ran.clear()
    assert main([*args, "--resume"]) == 0
    assert ran == ["react@0", "react@1"]
    report = json.loads((out / "noise.json").read_text())
    assert {s: list(by_p) for s, by_p in report["results"].items()} == {"adaptive": ["0", "1"], "react": ["0", "1"]}

    ran.clear()  # resumed with a new level for one strategy: the table keeps every cell measured before
    assert main(["--noise", "0.5", "--strategy", "react", *args[4:], "--resume"]) == 0
    assert ran == ["react@0.5"]
    after = json.loads((out / "noise.json").read_text())
    assert after["noise_levels"] == [0.0, 0.5, 1.0]
    assert {s: list(by_p) for s, by_p in after["results"].items()} == {"adaptive": ["0", "1"], "react": ["0", "0.5", "1"]}
    assert {s: {p: c for p, c in by_p.items() if p != "0.5"} for s, by_p in after["results"].items()} == report["results"]


@pytest.mark.parametrize("report", ['{"config": {}, "results": ["adaptive"]}', '{"config": [1], "results": {}}',
                                    '{"config": {}, "results": {"adaptive": 1}}', "directory"])
def test_resume_refuses_a_report_of_another_shape(report, tmp_path):
    """A report.json an evaluation did not write (tampered, or a directory) is one error naming it, read before any
    model loads."""
    from ziprl.config import load_config
    from ziprl.evaluation.harness import EvalResumeError, saved_results

    path = tmp_path / "report.json"
    path.mkdir() if report == "directory" else path.write_text(report)
    with pytest.raises(EvalResumeError, match=rf"--resume: {path} is not a report ZipRL wrote .*--overwrite"):
        saved_results(path, load_config(None, []))


def test_resume_names_trajectories_it_cannot_read(tmp_path):
    from ziprl.evaluation.harness import EvalResumeError, kept_trajectories

    (tmp_path / "trajectories_adaptive.parquet").write_bytes(b"PAR1 torn")
    with pytest.raises(EvalResumeError, match=r"trajectories_adaptive\.parquet cannot be read .*delete it to evaluate "
                                              r"adaptive again"):
        kept_trajectories(tmp_path, {"adaptive": {}, "react": {}})
    assert kept_trajectories(tmp_path, {"react": {}}) == {}  # measured, not written: rolled out again
