"""scripts/make_invented.py, scripts/make_sample.py and scripts/viewer_demo_run.py write a new or empty directory, or
an earlier output of the same script (scripts/_script_out.py): a user's directory is refused (exit 2, one ``error:``
line) with every file in it as it was, and bad input found in the data is refused before anything is written."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
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


def run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=300, env=env or {**os.environ, "OMP_NUM_THREADS": "1"})


def snapshot(root: Path) -> dict[str, object]:
    """Like ``digests``, but a named pipe is recorded as one instead of read (reading it would block)."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = (("link", os.readlink(p)) if p.is_symlink() else "fifo" if p.is_fifo()
                                         else "dir" if p.is_dir() else p.read_bytes())
    return out


def module(name: str, monkeypatch):
    """The script ``name`` (scripts/NAME.py) loaded as a module, so a test can replace what it calls."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


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


@pytest.mark.parametrize("what", ["directory", "fifo", "link"])
def test_a_rerun_over_an_entry_that_is_not_a_plain_file_is_refused_and_changes_nothing(tmp_path, what):
    """An earlier output whose train.jsonl became a directory (a named pipe, a link): the rerun names that entry, not a
    temporary path, and no file holds the new seed's content (README.md, the corpus and heldout.jsonl were replaced
    before the directory stopped the rerun)."""
    out = tmp_path / "inv"
    assert run("make_invented.py", "--out", str(out)).returncode == 0
    (out / "train.jsonl").unlink()
    if what == "directory":
        users(out, "train.jsonl/the user's file")
    elif what == "fifo":
        os.mkfifo(out / "train.jsonl")
    else:
        (out / "train.jsonl").symlink_to(out / "heldout.jsonl")
    before, around = snapshot(out), sorted(p.name for p in tmp_path.iterdir())
    line = refused(run("make_invented.py", "--out", str(out), "--seed", "7"))
    assert {"directory": f"{out / 'train.jsonl'} is a directory, not a file",
            "fifo": f"{out / 'train.jsonl'} is a special file", "link": f"{out} holds links (train.jsonl)"}[what] in line
    assert "choose another --out" in line and f".{out.name}." not in line
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == around  # no temporary directory left beside it


def test_an_unwritable_parent_is_refused_up_front_naming_out(tmp_path, monkeypatch, capsys):
    """The output is built beside --out: a parent where no file can be created is named with --out before anything is
    built (it was an error naming a temporary path). Root writes through permission bits, so the failing write is
    simulated."""
    out = tmp_path / "inv"
    assert run("make_invented.py", "--out", str(out)).returncode == 0  # its marker names the script
    script = module("make_invented", monkeypatch)
    before = digests(out)
    real = tempfile.TemporaryFile

    def no_write_in_parent(*args, **kwargs):
        if Path(kwargs.get("dir") or "") == tmp_path:
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", no_write_in_parent)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", lambda *a, **k: pytest.fail("built although refused"))
    code = script.main(["--out", str(out), "--seed", "7"])
    line = refused((code, capsys.readouterr().err))
    assert f"--out {out}" in line and f"parent directory {tmp_path} cannot be written (Permission denied)" in line
    assert digests(out) == before


def test_an_out_that_is_a_mount_point_is_refused_up_front(tmp_path, monkeypatch, capsys):
    """The output is built beside --out and moved in: across file systems that move would fail halfway, so an --out
    on another file system than its parent is refused before anything is built (simulated: the parent's device
    differs)."""
    out = tmp_path / "inv"
    assert run("make_invented.py", "--out", str(out)).returncode == 0
    script = module("make_invented", monkeypatch)
    before = digests(out)
    real = os.stat

    def other_device(path, *args, **kwargs):
        st = real(path, *args, **kwargs)
        return os.stat_result((*tuple(st)[:2], st.st_dev + 1, *tuple(st)[3:])) if Path(path) == tmp_path else st

    monkeypatch.setattr(os, "stat", other_device)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", lambda *a, **k: pytest.fail("built although refused"))
    line = refused((script.main(["--out", str(out), "--seed", "7"]), capsys.readouterr().err))
    assert f"--out {out} is a mount point" in line
    monkeypatch.undo()
    assert digests(out) == before


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
    script = module("make_sample", monkeypatch)
    load = script.load_hotpot_train
    monkeypatch.setattr(script, "load_hotpot_train", lambda path: [
        replace(e, supporting_titles=[*e.supporting_titles, "No such title"]) for e in load(path)])
    code = script.main(["--out", str(tmp_path / "s")])
    assert "supporting titles are missing from the sample corpus" in refused((code, capsys.readouterr().err))
    assert list(tmp_path.iterdir()) == []


@needs_shared
def test_make_sample_refuses_a_context_paragraph_missing_from_the_corpus_naming_question_and_paragraph(
        tmp_path, monkeypatch, capsys):
    """A question whose context paragraph is not in the pooled corpus: exit 2 naming both (it was a KeyError)."""
    script = module("make_sample", monkeypatch)
    contexts = script.context_paragraphs
    monkeypatch.setattr(script, "context_paragraphs", lambda shared: {
        q: [*pars, ("No such paragraph", "nowhere")] for q, pars in contexts(shared).items()})
    code = script.main(["--out", str(tmp_path / "s"), "--per-source", "1"])
    line = refused((code, capsys.readouterr().err))
    assert "not in the pooled corpus" in line and "'No such paragraph'" in line and "question '" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag, value, message", [
    ("--per-source", "-1", "'-1': must be at least 1"), ("--per-source", "0", "'0': must be at least 1"),
    ("--max-words", "-3", "'-3': must be at least 1"), ("--passages", "-100", "'-100': must be at least 0"),
    ("--passages", "many", "'many' is not an integer")])
def test_make_sample_refuses_a_count_out_of_range_before_reading_anything(tmp_path, flag, value, message):
    done = run("make_sample.py", "--out", str(tmp_path / "s"), flag, value)
    assert done.returncode == 2 and f"error: argument {flag}: {message}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@needs_shared
def test_make_sample_drops_empty_answers_and_refuses_an_empty_selection(tmp_path, monkeypatch, capsys):
    """Questions whose answer is empty are not kept (they were, as answers [""]); none left: exit 2, nothing
    written."""
    script = module("make_sample", monkeypatch)
    load = script.load_hotpot_train
    monkeypatch.setattr(script, "load_hotpot_train", lambda path: [replace(e, answers=[" "]) for e in load(path)])
    code = script.main(["--out", str(tmp_path / "s"), "--per-source", "1"])
    assert "no HotpotQA training question has a non-empty" in refused((code, capsys.readouterr().err))
    assert list(tmp_path.iterdir()) == []


def test_make_sample_without_a_data_directory_names_its_shared_flag(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ZIPRL_DATA", "ZIPRL_SHARED_DATA")}
    line = refused(run("make_sample.py", "--out", str(tmp_path / "s"), env=env))
    assert "pass --shared DATA_DIR or set ZIPRL_DATA=DATA_DIR" in line and "--set" not in line
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


@pytest.mark.parametrize("existing", [False, True])
def test_viewer_demo_run_loads_its_inputs_before_it_creates_or_marks_out(tmp_path, existing):
    """A cache that cannot be used (ZIPRL_CACHE naming a file): exit 2, and --out is neither created nor marked (it
    was left holding only a marker)."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.write_text("a file, not a directory\n")
    if existing:
        out.mkdir()
    before = digests(tmp_path)
    line = refused(run("viewer_demo_run.py", str(out), env={**os.environ, "OMP_NUM_THREADS": "1",
                                                             "ZIPRL_CACHE": str(cache)}))
    assert str(cache) in line
    assert digests(tmp_path) == before


def test_viewer_demo_run_writes_a_new_directory_and_rewrites_its_own(tmp_path):
    out = tmp_path / "demo"
    for _ in range(2):
        done = run("viewer_demo_run.py", str(out))
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        (MARKER, "trajectories", "trajectories_adaptive.parquet", "trajectories_react.parquet"))
    assert len(list((out / "trajectories").iterdir())) == 3


# ---------------------------------------------------------------- a run beside another process


def test_what_appears_in_a_new_out_during_the_build_is_kept_beside_the_output(tmp_path, monkeypatch):
    """The directory did not exist when the run checked it; a file someone writes there while the run builds (another
    script's output, a user's file) stays, beside the run's files, instead of being replaced with the directory."""
    script, out = module("make_invented", monkeypatch), tmp_path / "inv"
    real = script.write_invented

    def meanwhile(tmp, seed):
        users(out, "mine.txt")
        return real(tmp, seed)

    monkeypatch.setattr(script, "write_invented", meanwhile)
    assert script.main(["--out", str(out)]) == 0
    assert (out / "mine.txt").read_text() == "the user's mine.txt\n"
    assert sorted(p.name for p in out.iterdir()) == sorted((MARKER, "mine.txt", *INVENTED))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv"]  # no lock or temporary left beside it


def test_a_file_written_between_the_check_and_the_build_is_refused_under_the_lock(tmp_path, monkeypatch, capsys):
    script, out = module("make_invented", monkeypatch), tmp_path / "inv"
    real = script.checked_out

    def then_a_user_writes(*args):
        found = real(*args)
        users(out, "mine.txt")
        return found

    monkeypatch.setattr(script, "checked_out", then_a_user_writes)
    line = refused((script.main(["--out", str(out)]), capsys.readouterr().err))
    assert "is not empty (mine.txt)" in line
    assert snapshot(out) == {"mine.txt": b"the user's mine.txt\n"}


def test_a_second_run_on_one_out_is_refused_naming_the_first(tmp_path):
    from ziprl.outputs import hold, lock_path

    out = tmp_path / "inv"
    with hold(out):  # another run of a script writing there
        line = refused(run("make_invented.py", "--out", str(out)))
    assert f"{out} is in use by process {os.getpid()}" in line and str(lock_path(out)) in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_temporary_directory_of_a_killed_run_is_removed_by_the_next(tmp_path):
    out = tmp_path / "inv"
    users(tmp_path / ".inv.k1ll3d_x.tmp", "corpus.jsonl.gz")  # what a kill during the build left beside out
    users(tmp_path, ".inv.notes", ".inv.abcdefgh.tmp")  # a user's files of similar names: kept
    assert run("make_invented.py", "--out", str(out)).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".inv.abcdefgh.tmp", ".inv.notes", "inv"]
