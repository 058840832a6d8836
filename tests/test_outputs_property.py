"""A property of every command that writes (issue 46, item 7): random trees of user files around and inside the
output path (siblings, the parent, inside ``--out``, symbolic and hard links inside it, ``--out`` given through
``..`` or a link). Whatever the flags, the command exits 0 or 2, never 1; every file outside its own output keeps
its sha256; a refused command changes nothing at all; and a command that had not marked ``--out`` before changes
nothing that was there.

The commands are the real ``main()``s; what would load a model or play episodes is a stub that writes what the
real one writes, through the same library calls that apply the rule (:func:`ziprl.outputs.own_dir`,
``write_demos``); the index build and the viewer run for real on tiny inputs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ziprl.cli import demos, index, launch, sft, train
from ziprl.cli import eval as eval_cmd
from ziprl.env.demos import write_demos
from ziprl.evaluation.harness import REPORT_FILES
from ziprl.learner.sft import SFT_WRITES
from ziprl.outputs import LOCK, MARKER, normalise, own_dir
from ziprl.paths import atomic_write_json, atomic_write_text
from ziprl.rundir import write_config
from ziprl.testing.outputs import DEMO_ROW, StubEncoder, corpus, digests, fake_checkpoint, vectors
from ziprl.view import command as view

# names a user might have, the ones the commands write among them
NAME = st.sampled_from(["a", "b.txt", "x y", "é", "metrics.jsonl", "config.json", "tb", "checkpoints", "model",
                        "report.json", "manifest.json", "index.faiss", "passages.arrow", MARKER, ".ziprl-lock"])
TREE = st.recursive(st.binary(max_size=6), lambda kids: st.dictionaries(NAME, kids, max_size=3), max_leaves=6)
LINK = st.tuples(NAME, st.sampled_from(["symlink-file", "symlink-dir", "hardlink"]))
DIR_OUT = st.one_of(st.none(), st.just(b"a file"), st.dictionaries(NAME, TREE, max_size=4))
FILE_OUT = st.sampled_from(["none", "file", "dir", "hardlink", "symlink", "html"])


def build(root: Path, tree: dict) -> None:
    """The tree under ``root``; a user's file named like the lock never holds just a process id (that is a lock)."""
    for name, sub in tree.items():
        if isinstance(sub, dict):
            (root / name).mkdir()
            build(root / name, sub)
        else:
            (root / name).write_bytes(b"mine " + sub if name == LOCK else sub)


def add_links(out: Path, links: list[tuple[str, str]], outside: Path) -> None:
    """Links inside ``out`` to the user's files and folder outside it (names already taken are skipped)."""
    for name, kind in links:
        if os.path.lexists(out / name):
            continue
        if kind == "hardlink":
            os.link(outside / "data.bin", out / name)
        else:
            (out / name).symlink_to(outside / ("data.bin" if kind == "symlink-file" else "folder"))


@contextlib.contextmanager
def workplace(tmp_path: Path):
    """A fresh working directory per example: inputs, a parent holding siblings, and the user's data outside."""
    work = tmp_path / uuid.uuid4().hex
    (work / "outside" / "folder").mkdir(parents=True)
    (work / "outside" / "data.bin").write_bytes(b"precious")
    (work / "outside" / "folder" / "deep.txt").write_text("precious")
    (work / "parent").mkdir()
    (work / "parent" / "sibling.txt").write_text("sibling")
    (work / "inputs").mkdir()
    old = Path.cwd()
    os.chdir(work)
    try:
        yield work
    finally:
        os.chdir(old)


def check(work: Path, before: dict, out_arg: str, code: int, marked_before: bool) -> None:
    """The property, for the output ``out_arg`` (as given) once the command exited with ``code``."""
    assert code in (0, 2)
    event(f"exit {code}" + (" over its own output" if marked_before else ""))
    after = digests(work)
    if code == 2 or not marked_before:
        changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
        assert not changed, changed
    if code == 2:
        assert set(after) == set(before), set(after) ^ set(before)
    own, root = normalise(out_arg), normalise(work)
    changed = {k: (v, after.get(k)) for k, v in before.items() if not (root / k).is_relative_to(own)
               and after.get(k) != v}
    assert not changed, changed


def out_argument(form: str, path: str) -> str:
    """``path`` given plainly, through a missing folder and ``..``, or through a link beside it."""
    if form == "dotdot":
        return f"nosuch/../{path}"
    if form == "link":
        link = Path(f"link-{uuid.uuid4().hex[:6]}")
        link.symlink_to(Path(path).resolve(), target_is_directory=True)
        return str(link)
    return path


# ---------------------------------------------------------------- the commands, with their slow parts stubbed


def train_stub(cfg) -> dict:
    """What a training run writes: config, an appended metrics line, TensorBoard, a trajectory file, a checkpoint."""
    out = Path(cfg.run.out_dir)
    write_config(out, {"stub": 1})
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 1}\n')
    atomic_write_text(out / "tb" / "events.out", "events")
    atomic_write_text(out / "trajectories" / f"step_{uuid.uuid4().hex[:6]}.parquet", "PAR1")
    if not (out / "checkpoints" / "latest").exists():
        fake_checkpoint(out / "checkpoints")
    return {}


def sft_stub(cfg, demos_path, out_dir, resume=False, stop=None, rows=None) -> Path:
    out = own_dir(out_dir, "sft", SFT_WRITES)
    atomic_write_json(out / "model" / "config.json", {"stub": 1})
    atomic_write_text(out / "tb" / "events.out.tfevents.1.stub", "events")
    return out / "model"


def eval_stub(cfg, strategies, out, resume=False) -> dict:
    out = own_dir(out, "eval", [*REPORT_FILES, *(f"trajectories_{s}.parquet" for s in strategies)])
    for name in REPORT_FILES:
        atomic_write_text(out / name, "report")
    return {}


def demos_stub(cfg, examples=None, **_) -> tuple[Path, dict]:
    counts = dict.fromkeys(("kept", "episodes", "wrong", "malformed", "no_supporting_titles", "transitions"), 1)
    return write_demos([DEMO_ROW], cfg.demos.out), counts


@pytest.fixture
def stubs(monkeypatch, no_models):
    monkeypatch.setattr("ziprl.cli.train.train", train_stub)
    monkeypatch.setitem(sys.modules, "ziprl.actors.launch", types.SimpleNamespace(launch=train_stub))
    monkeypatch.setattr("ziprl.cli.sft.run_sft", sft_stub)
    monkeypatch.setattr("ziprl.cli.eval.evaluate", eval_stub)
    monkeypatch.setattr("ziprl.cli.index.Encoder", lambda *a, **k: StubEncoder())
    monkeypatch.setattr("ziprl.cli.demos.build_demos", demos_stub)


def dir_command(name: str, work: Path):
    """``argv-tail -> exit code`` of a command writing a directory (inputs written into ``work/inputs``)."""
    if name in ("train", "launch"):
        main = train.main if name == "train" else launch.main
        return lambda out, flags: main(["--out", out, *flags])
    if name == "sft":
        write_demos([DEMO_ROW], work / "inputs" / "demos.parquet")
        return lambda out, flags: sft.main(["--demos", "inputs/demos.parquet", "--out", out, *flags])
    if name == "eval":
        return lambda out, flags: eval_cmd.main(["--out", out, *flags])
    c, v = corpus(work / "inputs" / "c.jsonl"), vectors(work / "inputs" / "v.npy")
    return lambda out, flags: index.main(["build", "--corpus", str(c), "--embeddings", str(v), "--no-progress",
                                          "--out", out, *[f for f in flags if f == "--overwrite"]])


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("name", ["train", "launch", "sft", "eval", "index"])
@SETTINGS
@given(inside=DIR_OUT, links=st.lists(LINK, max_size=3), premark=st.booleans(), form=st.sampled_from(
    ["plain", "dotdot", "link"]), flag=st.sampled_from([None, "--overwrite", "--resume"]), around=TREE)
def test_a_directory_command_touches_nothing_outside_its_output(name, inside, links, premark, form, flag, around,
                                                                 tmp_path, stubs, capsys):
    with workplace(tmp_path) as work:
        run = dir_command(name, work)
        if isinstance(around, dict):
            build(work / "parent", {k: v for k, v in around.items() if k != "out"})
        out = work / "parent" / "out"
        if premark:
            assert run("parent/out", []) == 0
        if isinstance(inside, bytes) and not premark:
            out.write_bytes(inside)
        elif isinstance(inside, dict):
            out.mkdir(exist_ok=True)
            build(out, {k: v for k, v in inside.items() if not os.path.lexists(out / k)})
            add_links(out, links, work / "outside")
        out_arg = out_argument(form, "parent/out") if out.is_dir() or form != "link" else "parent/out"
        before = digests(work)
        flags = [flag] if flag and (flag != "--resume" or name in ("train", "launch", "sft", "eval")) else []
        code = run(out_arg, flags)
        check(work, before, out_arg, code, premark)
    capsys.readouterr()


@pytest.mark.parametrize("name", ["demos", "view"])
@SETTINGS
@given(existing=FILE_OUT, premark=st.booleans(), overwrite=st.booleans(), around=TREE)
def test_a_file_command_touches_nothing_but_its_own_file(name, existing, premark, overwrite, around, tmp_path, stubs,
                                                         capsys):
    from ziprl.testing.viewer_data import write_run

    with workplace(tmp_path) as work:
        if name == "view":
            run_dir = write_run(work / "inputs" / "run", n=2, steps=1)
            path = "parent/r.html"

            def run(out, flags):
                return view.main([str(run_dir), "--out", out, "--tokenizer", "none", *flags])
        else:
            path = "parent/d.parquet"

            def run(out, flags):
                return demos.main(["--out", out, *flags])
        if isinstance(around, dict):
            build(work / "parent", {k: v for k, v in around.items() if k not in ("r.html", "d.parquet")})
        target = work / path
        if premark:
            assert run(path, []) == 0
        elif existing == "file":
            target.write_bytes(b"my own data")
        elif existing == "html":
            target.write_text("<html><head><title>mine</title></head></html>")
        elif existing == "dir":
            target.mkdir()
            (target / "inner.txt").write_text("mine")
        elif existing == "hardlink":
            os.link(work / "outside" / "data.bin", target)
        elif existing == "symlink":
            target.symlink_to(work / "outside" / "data.bin")
        before = digests(work)
        code = run(path, ["--overwrite"] if overwrite else [])
        check(work, before, path, code, premark)
        if code == 0:
            assert set(digests(work)) == set(before) | {path}
    capsys.readouterr()
