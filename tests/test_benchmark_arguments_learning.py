"""Bad arguments of the learning, scoring and retrieval benchmarks exit 2 with one ``error:`` line naming the problem
and the fix, before any work: no traceback, nothing under benchmarks/results/ changed, no --out or --work created or
changed. Each script runs as a subprocess and exits within a second or two."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from ziprl.env.trajectory import Trajectory, Turn, save_trajectories
from ziprl.outputs import write_marker
from ziprl.testing.local_model import passing_model_dir
from ziprl.testing.outputs import digests

RESULTS = REPO / "benchmarks" / "results"
NEW = "{new}"  # an --out or --work that must not be created

CASES = [  # (script, argv ({tmp}: the test's inputs, {new}: a path), what stderr says)
    ("fuzz_env.py", ["--turns", "0"], "argument --turns: '0': must be at least 1"),
    ("fuzz_env.py", ["--turns", "-5"], "argument --turns: '-5': must be at least 1"),
    ("fuzz_env.py", ["--turns", "many"], "argument --turns: 'many' is not an integer"),
    ("learning_gate.py", ["--seeds", "a"], "argument --seeds: 'a' is not an integer"),
    ("learning_gate.py", ["--seeds", "-1"], "argument --seeds: '-1': must be at least 0"),
    ("learning_gate.py", ["--configs", "bogus"], "argument --configs: unknown 'bogus'; choose from bandit, bandit_bf16, search"),
    ("learning_gate.py", ["--configs", ","], "argument --configs: ',': give at least one comma-separated value"),
    ("learning_gate.py", ["--mutations", "advantage_sign,bogus"], "argument --mutations: unknown 'bogus'; choose "
                                                                   "from advantage_sign,"),
    ("learning_gate.py", ["--mutation-seeds", "bogus=1"], "argument --mutation-seeds: unknown 'bogus'; choose from bandit"),
    ("learning_gate.py", ["--mutation-seeds", "search=x"], "argument --mutation-seeds: 'x' is not an integer"),
    ("learning_gate.py", ["--configs", "bandit", "--mutation-seeds", "search=1"],
     "--mutation-seeds names search, which --configs does not run; add it to --configs"),
    ("learning_gate.py", ["--hrr-seeds", "0,b"], "argument --hrr-seeds: 'b' is not an integer"),
    ("learning_gate.py", ["--drift-seeds", "4294967296"], "argument --drift-seeds: '4294967296': a seed is at most"),
    ("learning_gate.py", ["--seeds", "", "--mutations", "none", "--hrr-seeds", "", "--drift-seeds", ""],
     "nothing to run: give --seeds, --mutations, --hrr-seeds or --drift-seeds"),
    ("allocation.py", ["--scales", "abc"], "argument --scales: 'abc': a level scale is a finite number > 0"),
    ("allocation.py", ["--scales", "0.1,0"], "argument --scales: '0': a level scale is a finite number > 0"),
    ("allocation.py", ["--scales", "nan"], "argument --scales: 'nan': a level scale is a finite number > 0"),
    ("allocation.py", ["--limit", "-1"], "argument --limit: '-1': must be at least 0"),
    ("allocation.py", ["--limit", "1"], "error: this dataset reads its files from a data directory and none is given: "
                                        "set ZIPRL_DATA"),
    ("scoring.py", ["--data", "/nonexistent"], "argument --data: /nonexistent: No such file or directory; pass the "
                                               "gzipped JSON file"),
    ("scoring.py", ["--data", "README.md"], "argument --data: README.md is not a gzip file; pass the gzipped JSON file"),
    ("scoring.py", ["--questions", "{tmp}"], "argument --questions: {tmp}: Is a directory"),
    ("scoring.py", ["--n", "7"], "argument --n: '7': must be at least 8"),
    ("scoring.py", ["--repeats", "0"], "argument --repeats: '0': must be at least 1"),
    ("scoring.py", ["--data", "{tmp}/corpus.json.gz"], "error: this dataset reads its files from a data directory"),
    ("scoring.py", ["--data", "{tmp}/list.json.gz", "--questions", "{tmp}/list.json.gz"],
     "error: --data {tmp}/list.json.gz cannot be read as the HotpotQA file it names (a list, not a non-empty JSON "
     "dict); pass the release's file"),
    ("scoring.py", ["--data", "{tmp}/broken.json.gz", "--questions", "{tmp}/list.json.gz"],
     "error: --data {tmp}/broken.json.gz cannot be read as the HotpotQA file it names (Expecting value"),
    ("scoring.py", ["--data", "{tmp}/corpus.json.gz", "--questions", "{tmp}/list.json.gz"],
     "error: --questions {tmp}/list.json.gz: every record needs 'question' and 'context'"),
    ("context_efficiency.py", ["--turns", "0"], "argument --turns: '0': must be at least 1"),
    ("context_efficiency.py", ["--real-turns", "-1"], "argument --real-turns: '-1': must be at least 0"),
    ("context_efficiency.py", ["--questions", "0"], "argument --questions: '0': must be at least 1"),
    ("base_rate.py", ["--questions", "0", "--model", "/nonexistent"], "argument --questions: '0': must be at least 1"),
    ("base_rate.py", ["--group", "0", "--model", "/nonexistent"], "argument --group: '0': must be at least 1"),
    ("base_rate.py", ["--seed", "-1", "--model", "/nonexistent"], "argument --seed: '-1': must be at least 0"),
    ("base_rate.py", ["--model", "{tmp}/model", "--seed", "4294967296"], "error: data.seed must be in 0..4294967295"),
    ("base_rate.py", ["--model", "/nonexistent"], "argument --model: '/nonexistent' is not a directory"),
    ("base_rate.py", ["--model", "{tmp}"], "argument --model: model directory {tmp} has no config.json"),
    ("learner_packing.py", ["--trajectories", "{tmp}/step.parquet", "--config", "/nonexistent"],
     "error: --config: config file /nonexistent does not exist"),
    ("learner_packing.py", ["--trajectories", "{tmp}/step.parquet", "--model", "/nonexistent"],
     "argument --model: '/nonexistent' is not a directory"),
    ("learner_packing.py", ["--trajectories", "{tmp}/list.json.gz"], "{tmp}/list.json.gz (not a Parquet file"),
    ("learner_packing.py", ["--trajectories", "{tmp}/step.parquet", "--groups", "-1"],
     "argument --groups: '-1': must be at least 0"),
    ("step_profile.py", ["--config", "/nonexistent"], "error: --config: config file /nonexistent does not exist"),
    ("step_profile.py", ["--config", "README.md"], "error: --config: config file README.md: not valid YAML"),
    ("step_profile.py", ["--model", "/nonexistent"], "argument --model: '/nonexistent' is not a directory"),
    ("step_profile.py", ["--steps", "1"], "argument --steps: '1': must be at least 2"),
    ("step_profile.py", ["--variants", "float32,bogus"], "argument --variants: unknown variant 'bogus'; choose from"),
    ("hrr_credit.py", ["--runs", "{tmp}/runs"], "error: --runs: {tmp}/runs/w0.2_seed1/trajectories/step_000001.parquet "
                                                "is not a trajectory file"),
    ("hrr_credit.py", ["--runs", "{tmp}/runs", "--max-step", "0"], "argument --max-step: '0': must be at least 1"),
    ("retrieval_scale.py", ["--work", "{tmp}/scale", "--n", "3000"],
     "error: --work: {tmp}/scale/data.json is not the data record this benchmark writes"),
    ("retrieval_scale.py", ["--work", "{tmp}/learning", "--n", "3000"],
     "is a benchmark's working directory (its .ziprl-run says so), not retrieval_scale.py's working directory"),
    ("retrieval_scale.py", ["--work", NEW, "--sweep", "0"], "argument --sweep: '0': must be at least 1"),
    ("retrieval_scale.py", ["--work", NEW, "--sharded", "bogus"], "argument --sharded: invalid choice: 'bogus'"),
    ("retrieval_scale.py", ["--work", NEW, "--n", "1999"], "--n 1999: the corpus holds the sample's 2000 real passages"),
    ("learning_compare.py", ["--out", NEW, "--run", "../../x"], "argument --run: '../../x': give the name of a run "
                                                                "directory directly under --out"),
    ("learning_compare.py", ["--out", NEW, "--run", "a/b"], "argument --run: 'a/b': give the name of a run directory"),
    ("learning_compare.py", ["--out", NEW, "--run", ".."], "argument --run: '..': give the name of a run directory"),
    ("learning_compare.py", ["--out", NEW, "--run", ".hidden"], "argument --run: '.hidden': give the name of a run"),
    ("learning_compare.py", ["--out", NEW, "--run", "/abs"], "argument --run: '/abs': give the name of a run"),
    ("learning_compare.py", ["--out", NEW, "--step", "0"], "--limit, --workers and --step must be >= 1"),
    ("learning_compare.py", ["--out", NEW, "--workers", "0"], "--limit, --workers and --step must be >= 1"),
    ("learning_compare.py", ["--out", NEW, "--limit", "x"], "argument --limit: invalid int value: 'x'"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The files the cases name as ``{tmp}``: gzipped JSON of the wrong kinds, a trajectory file, a learning.py-style
    runs directory with a step file that is not Parquet, and two working directories a case must leave as they are."""
    tmp = tmp_path_factory.mktemp("inputs")
    for name, text in (("list.json.gz", "[1]"), ("broken.json.gz", "nope"), ("corpus.json.gz", '{"t": ["x"]}')):
        (tmp / name).write_bytes(gzip.compress(text.encode()))
    save_trajectories([Trajectory(question_id="q", question="?", answers=["a"], turns=[Turn(action="search")])],
                      tmp / "step.parquet")
    save_trajectories([Trajectory(question_id="q", question="?", answers=["a"], turns=[Turn(action="search")])],
                      tmp / "runs" / "w0.2_seed0" / "trajectories" / "step_000001.parquet")
    bad = tmp / "runs" / "w0.2_seed1" / "trajectories" / "step_000001.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_text("not parquet")
    write_marker(tmp / "scale", "bench-retrieval_scale")
    (tmp / "scale" / "data.json").write_text('{"n": 3000}')
    write_marker(tmp / "learning", "bench")
    passing_model_dir(tmp / "model")
    return tmp


@pytest.mark.parametrize(("script", "argv", "said"), CASES,
                         ids=[f"{s}:{' '.join(a)}"[:70] for s, a, _ in CASES])
def test_a_bad_argument_exits_2_with_one_error_line_before_any_work(inputs, tmp_path, script, argv, said):
    fill = lambda text: text.replace("{tmp}", str(inputs)).replace(NEW, str(tmp_path / "new"))  # noqa: E731
    env = {k: v for k, v in os.environ.items() if k != "ZIPRL_DATA"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", ZIPRL_CACHE=str(tmp_path / "cache"))
    results, given = digests(RESULTS), digests(inputs)
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *map(fill, argv)], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert fill(said) in done.stderr
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if "error:" in line] == [done.stderr.splitlines()[-1]]
    assert digests(RESULTS) == results
    assert digests(inputs) == given
    assert not (tmp_path / "new").exists() and not (tmp_path / "cache").exists()
