"""scripts/make_invented.py, scripts/make_sample.py and scripts/viewer_demo_run.py write a new or empty directory, or
an earlier output of the same script (scripts/_script_out.py): a user's directory is refused (exit 2, one ``error:``
line) with every file in it as it was, and bad input found in the data is refused before anything is written."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED
from ziprl.outputs import MARKER, read_marker, write_marker
from ziprl.testing.outputs import digests

SCRIPTS = REPO / "scripts"
INVENTED = ("README.md", "corpus.jsonl.gz", "train.jsonl", "heldout.jsonl")
SAMPLE = ("qa.jsonl", "corpus.jsonl.gz", "ATTRIBUTION.md")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"make_sample.py reads the data directory ({SHARED}, "
                                  "or $ZIPRL_DATA; docs/data.md), which is not here")


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def refused(done: subprocess.CompletedProcess | tuple[int, str]) -> str:
    """The one ``error:`` line of a run that exited 2."""
    code, err = (done.returncode, done.stderr) if isinstance(done, subprocess.CompletedProcess) else done
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def users(root: Path, *names: str) -> Path:
    """A user's directory holding ``names`` (one may be in a subdirectory)."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"the user's {name}\n")
    return root


# ---------------------------------------------------------------- make_invented.py


def test_make_invented_refuses_a_users_directory_and_changes_nothing(tmp_path):
    mine = users(tmp_path / "mine", "README.md", "train.jsonl")
    before = digests(mine)
    assert "is not an earlier output of make_invented.py" in refused(run("make_invented.py", "--out", str(mine)))
    assert digests(mine) == before


def test_make_invented_refuses_another_scripts_output(tmp_path):
    theirs = users(tmp_path / "theirs", "qa.jsonl")
    write_marker(theirs, "data", "make_sample.py --out theirs")
    before = digests(theirs)
    assert "make_invented.py" in refused(run("make_invented.py", "--out", str(theirs)))
    assert digests(theirs) == before


def test_make_invented_writes_a_new_or_empty_directory_and_rewrites_its_own(tmp_path):
    new, empty = tmp_path / "new", tmp_path / "empty"
    assert run("make_invented.py", "--out", str(new)).returncode == 0
    assert sorted(p.name for p in new.iterdir()) == sorted((MARKER, *INVENTED))
    assert read_marker(new)["kind"] == "data"
    seed0 = (new / "train.jsonl").read_bytes()
    again = run("make_invented.py", "--out", str(new), "--seed", "1")
    assert again.returncode == 0, again.stderr
    assert (new / "train.jsonl").read_bytes() != seed0
    assert sorted(p.name for p in new.iterdir()) == sorted((MARKER, *INVENTED))  # nothing left beside the files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]  # nor beside the directory
    empty.mkdir()
    inode = empty.stat().st_ino
    assert run("make_invented.py", "--out", str(empty)).returncode == 0
    assert empty.stat().st_ino == inode  # the user's empty directory is filled, not replaced
    assert (empty / "train.jsonl").read_bytes() == seed0


# ---------------------------------------------------------------- make_sample.py


@needs_shared
def test_make_sample_refuses_a_users_directory_and_changes_nothing(tmp_path):
    mine = users(tmp_path / "mine", "qa.jsonl", "index/manifest.json")
    before = digests(mine)
    assert "is not an earlier output of make_sample.py" in refused(run("make_sample.py", "--out", str(mine)))
    assert digests(mine) == before


@needs_shared
def test_make_sample_refuses_more_passages_than_the_pool_before_writing(tmp_path):
    line = refused(run("make_sample.py", "--out", str(tmp_path / "s"), "--passages", "10000000"))
    assert "--passages 10000000 is more than the pooled corpus holds" in line
    assert list(tmp_path.iterdir()) == []


@needs_shared
def test_make_sample_checks_the_supporting_titles_before_writing(tmp_path, monkeypatch, capsys):
    """A question whose supporting title no passage has: exit 2, nothing written (qa.jsonl and the corpus were
    written before the check, and the exit code was 1)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("make_sample", SCRIPTS / "make_sample.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    load = script.load_hotpot_train
    monkeypatch.setattr(script, "load_hotpot_train", lambda path: [
        replace(e, supporting_titles=[*e.supporting_titles, "No such title"]) for e in load(path)])
    code = script.main(["--out", str(tmp_path / "s")])
    assert "supporting titles are missing from the sample corpus" in refused((code, capsys.readouterr().err))
    assert list(tmp_path.iterdir()) == []


@needs_shared
def test_make_sample_writes_a_new_directory_and_rewrites_its_own(tmp_path):
    out = tmp_path / "s"
    assert run("make_sample.py", "--out", str(out)).returncode == 0
    first = digests(out)
    again = run("make_sample.py", "--out", str(out), "--passages", "1500")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted((MARKER, *SAMPLE))
    assert digests(out)["corpus.jsonl.gz"] != first["corpus.jsonl.gz"]


# ---------------------------------------------------------------- viewer_demo_run.py


@pytest.mark.parametrize("marker", [None, ("bench", "learning.py --out out"), ("run", "train.py")])
def test_viewer_demo_run_refuses_a_directory_it_did_not_write(tmp_path, marker):
    """A user's directory, a benchmark's or a train run's (whose trajectories it would replace): exit 2, nothing
    changed."""
    out = users(tmp_path / "out", "trajectories_adaptive.parquet", "trajectories/step_000001.parquet")
    if marker:
        write_marker(out, *marker)
    before = digests(out)
    assert str(out) in refused(run("viewer_demo_run.py", str(out)))
    assert digests(out) == before


def test_viewer_demo_run_writes_a_new_directory_and_rewrites_its_own(tmp_path):
    out = tmp_path / "demo"
    for _ in range(2):
        done = run("viewer_demo_run.py", str(out))
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        (MARKER, "trajectories", "trajectories_adaptive.parquet", "trajectories_react.parquet"))
    assert len(list((out / "trajectories").iterdir())) == 3
