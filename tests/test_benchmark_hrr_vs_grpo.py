"""benchmarks/hrr_vs_grpo.py: every input is checked before its --out is created, marked or cleared, and that --out is
its own (never learning.py's working directory, nor a run inside one)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ziprl.outputs import read_marker, write_marker
from ziprl.testing.local_model import passing_model_dir
from ziprl.testing.outputs import digests

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SCRIPT = BENCH / "hrr_vs_grpo.py"


@pytest.fixture(scope="module")
def hrr():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_hrr_vs_grpo", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(autouse=True)
def as_the_script(monkeypatch, tmp_path):
    """``sys.argv[0]`` the benchmark's; no data directory; nothing trains or builds Stage 1."""
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])
    monkeypatch.setenv("ZIPRL_DATA", str(tmp_path / "nodata"))
    monkeypatch.delenv("ZIPRL_SHARED_DATA", raising=False)


@pytest.fixture
def no_work(hrr, monkeypatch):
    monkeypatch.setattr(hrr, "stage1", lambda *a: pytest.fail("Stage 1 started"))
    monkeypatch.setattr(hrr, "run_one", lambda *a: pytest.fail("a run started"))


def _learning_out(root: Path) -> Path:
    """learning.py's working directory with a run in it."""
    write_marker(root, "bench")
    run = root / "w0_seed0"
    write_marker(run, "run")
    (run / "metrics.jsonl").write_text('{"step": 1, "rollout/reward": 0.5}\n')
    (run / "config.json").write_text('{"learner": {"steps": 6}}\n')
    return root


def _code(hrr, argv: list[str]) -> int:
    try:
        return hrr.main(argv)
    except SystemExit as exc:
        return exc.code


def _one_error(err: str, said: str) -> None:
    assert said in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_a_learning_work_dir_with_a_run_is_left_untouched_when_the_inputs_are_bad(tmp_path):
    """The reported case, as the command runs: a missing --sft-checkpoint and no data used to clear the run's
    metrics and config before the traceback; now one error line, exit 2, every byte where it was."""
    out = _learning_out(tmp_path / "out")
    before = digests(out)
    env = {k: v for k, v in os.environ.items() if k not in ("ZIPRL_DATA", "ZIPRL_SHARED_DATA")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--seeds", "0", "--steps", "6",
                           "--sft-checkpoint", str(tmp_path / "nonexistent")], capture_output=True, text=True,
                          env=env | {"OMP_NUM_THREADS": "1"}, cwd=REPO, timeout=60)
    assert done.returncode == 2
    _one_error(done.stderr, "--sft-checkpoint")
    assert digests(out) == before


def test_a_learning_work_dir_is_refused_with_good_inputs_too(hrr, no_work, tmp_path, capsys):
    """Its runs share names with learning.py's (w0_seed0): the directory is refused by its marker, exit 2."""
    out = _learning_out(tmp_path / "out")
    before = digests(out)
    code = _code(hrr, ["--out", str(out), "--seeds", "0", "--dataset", "invented",
                       "--sft-checkpoint", str(passing_model_dir(tmp_path / "model"))])
    assert code == 2
    _one_error(capsys.readouterr().err, "not hrr_vs_grpo.py's working directory")
    assert digests(out) == before


def test_a_new_out_is_marked_as_its_own(hrr, tmp_path, monkeypatch):
    given = []
    monkeypatch.setattr(hrr, "run", lambda args, out: given.append(out))
    out = tmp_path / "out"
    assert hrr.main(["--out", str(out), "--seeds", "0", "--dataset", "invented",
                     "--sft-checkpoint", str(passing_model_dir(tmp_path / "model"))]) == 0
    assert given == [out.resolve()]
    assert read_marker(out)["kind"] == hrr.KIND == "bench-hrr_vs_grpo"


@pytest.mark.parametrize(("argv", "said"), [
    (["--seeds", "a"], "argument --seeds: 'a' is not an integer"),
    (["--seeds", "0,0"], "--seeds 0,0: give each seed once"),
    (["--group-size", "0"], "argument --group-size: '0': must be at least 1"),
    (["--steps", "0"], "argument --steps: '0': must be at least 1"),
    (["--max-turns", "0"], "argument --max-turns: '0': must be at least 1"),
    (["--demo-limit", "-1"], "argument --demo-limit: '-1': must be at least 0"),
    (["--sft-checkpoint", "nosuch"], "argument --sft-checkpoint: 'nosuch' is not a directory"),
    (["--sft-checkpoint", "."], "has no config.json"),
    (["--dataset", "nosuch"], "unknown dataset 'nosuch'"),
    (["--sft-checkpoint", ""], "argument --sft-checkpoint: '' is not a directory"),
    (["--dataset", "pooled"], "data directory"),  # $ZIPRL_DATA names no directory
    (["--no-model"], "data directory"),  # Stage 1 plays HotpotQA and MuSiQue: their data is checked
])
def test_a_bad_argument_exits_2_before_anything_is_created(hrr, no_work, tmp_path, monkeypatch, capsys, argv, said):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    model = [] if argv == ["--no-model"] else ["--sft-checkpoint", str(passing_model_dir(tmp_path / "model"))]
    code = _code(hrr, ["--out", str(out), "--dataset", "invented", *model, *[a for a in argv if a != "--no-model"]])
    assert code == 2
    _one_error(capsys.readouterr().err, said)
    assert [p.name for p in tmp_path.iterdir()] == (["model"] if model else [])  # no --out, nothing else


def test_report_only_needs_the_last_results_and_finished_runs(hrr, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hrr, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(hrr, "report", lambda *a: pytest.fail("reported"))
    assert _code(hrr, ["--report-only", "--out", str(tmp_path / "out")]) == 2
    _one_error(capsys.readouterr().err, "hrr_vs_grpo.json is missing: run without --report-only")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "hrr_vs_grpo.json").write_text(json.dumps({"meta": {"steps": 6, "seeds": [0]}}))
    assert _code(hrr, ["--report-only", "--out", str(tmp_path / "out")]) == 2
    _one_error(capsys.readouterr().err, "not every run under")
