"""Run directories and checkpoints: nothing of an earlier run is lost (issue 14, item 1), and ``--overwrite``
deletes nothing but a marked ZipRL run, only after every input is checked (issue 23, item 1)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ziprl.cli import launch, train
from ziprl.learner.checkpoint import clean_orphans, latest_checkpoint, save_checkpoint, verify_checkpoint
from ziprl.outputs import MARKER, OutputError, read_marker
from ziprl.rundir import plan_run_dir, prepare_run_dir, write_config
from ziprl.testing.learner import make_cfg, requires_deepspeed


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    from ziprl.learner.trainer import Trainer

    return Trainer(make_cfg(beta=0.0), tiny_model_dir)


@pytest.fixture(scope="module")
def run_dir(trainer, tmp_path_factory):
    """A run directory holding one real checkpoint (step 1)."""
    out = tmp_path_factory.mktemp("run")
    trainer.global_step = 1
    save_checkpoint(trainer, out, {"cursor": 1})
    return out


def copy_run(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "run")


@requires_deepspeed
def test_a_second_run_in_the_same_dir_loses_nothing(trainer, tmp_path):
    """The reproduction: run A writes steps 1-3, run B's step 1 then repointed `latest` at a pruned directory."""
    old = []
    for step in (1, 2, 3):
        trainer.global_step = step
        old.append(save_checkpoint(trainer, tmp_path, {"run": "a"}, keep=2))
    trainer.global_step = 1
    new = save_checkpoint(trainer, tmp_path, {"run": "b"}, keep=2)
    assert latest_checkpoint(tmp_path) == new
    assert verify_checkpoint(new)  # `latest` names a complete checkpoint
    assert new not in old
    assert old[2].is_dir()  # names never collide; the newest-written are kept
    assert json.loads((new / "state.json").read_text())["data_position"] == {"run": "b"}
    assert json.loads((old[2] / "state.json").read_text())["data_position"] == {"run": "a"}


@requires_deepspeed
def test_a_non_empty_dir_needs_resume_or_overwrite(run_dir, tmp_path):
    with pytest.raises(OutputError, match="--resume to continue it if an older ZipRL run wrote it"):
        prepare_run_dir(run_dir, resume=False, overwrite=False)
    assert prepare_run_dir(tmp_path / "new", resume=False, overwrite=False) is None
    assert (tmp_path / "new").is_dir()
    out = copy_run(run_dir, tmp_path)
    (out / MARKER).write_text('{"format": 1}')
    with pytest.raises(OutputError, match="--resume to continue.*--overwrite"):  # marked: both fixes are offered
        prepare_run_dir(out, resume=False, overwrite=False)
    assert prepare_run_dir(out, resume=False, overwrite=True) is None
    assert [p.name for p in out.iterdir()] == [MARKER]
    with pytest.raises(OutputError, match="contradict"):
        prepare_run_dir(out, resume=True, overwrite=True)


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    with pytest.raises(OutputError, match="holds no run to resume"):
        prepare_run_dir(tmp_path / "none", resume=True, overwrite=False)
    (tmp_path / "logs").mkdir()
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(OutputError, match="no checkpoint to resume from"):
        prepare_run_dir(tmp_path, resume=True, overwrite=False)


@requires_deepspeed
def test_resume_returns_the_verified_latest_and_cleans_killed_writes(run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    root = out / "checkpoints"
    (root / ".step_2-deadbeef.k2j_h4xz").mkdir()  # what a killed write leaves (atomic_dir's, atomic_path's names)
    (root / ".step_2-deadbeef.k2j_h4xz" / "model.safetensors").write_bytes(b"partial")
    (root / ".step_1-deadbeef.old-0123abcd").mkdir()
    (root / ".latest.0123abcd.tmp").write_text("step_2-deadbeef\n")
    assert read_marker(out) is None  # a run of a ZipRL older than the marker still resumes, and is marked
    assert prepare_run_dir(out, resume=True, overwrite=False) == latest_checkpoint(out)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    assert read_marker(out)["format"] == 1
    assert clean_orphans(out) == []


@requires_deepspeed
@pytest.mark.parametrize("damage", ["dangling", "garbage_pointer", "truncated", "bad_state", "missing_file"])
def test_resume_rejects_a_broken_checkpoint_before_any_model_loads(damage, run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    ckpt = latest_checkpoint(out)
    if damage == "dangling":
        shutil.rmtree(ckpt)
    elif damage == "garbage_pointer":
        (out / "checkpoints" / "latest").write_bytes(b"\xff../../etc\n")
    elif damage == "truncated":
        data = (ckpt / "model.safetensors").read_bytes()
        (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "bad_state":
        (ckpt / "state.json").write_text('{"step": 1')
    else:
        (ckpt / "rng.safetensors").unlink()
    with pytest.raises(OutputError, match="--resume: .*--overwrite"):
        prepare_run_dir(out, resume=True, overwrite=False)


def test_a_resumed_run_keeps_the_old_config(tmp_path):
    first = write_config(tmp_path, {"lr": 1})
    assert write_config(tmp_path, {"lr": 1}) == first  # same config: same file
    second = write_config(tmp_path, {"lr": 2})
    assert second != first
    assert json.loads(first.read_text()) == {"lr": 1}
    assert json.loads(second.read_text()) == {"lr": 2}


def test_a_resume_with_the_same_config_leaves_config_json_as_it_is(tmp_path):
    path = write_config(tmp_path, {"lr": 1})
    before = os.stat(path)
    assert write_config(tmp_path, {"lr": 1}) == path
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_config_write_that_fails_leaves_no_config_json(tmp_path, monkeypatch):
    """Written beside and renamed: a write that fails (a full disk, a kill) leaves no torn config.json to resume."""
    import ziprl.paths

    def full_disk(path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ziprl.paths, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_config(tmp_path, {"lr": 1})
    assert list(tmp_path.iterdir()) == []


def test_overwrite_refuses_to_delete_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "precious.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match="working or home directory"):
        prepare_run_dir(tmp_path, resume=False, overwrite=True)
    assert (tmp_path / "precious.txt").is_file()


# ---------------------------------------------------------------- --overwrite deletes only a marked run (issue 23)


def snapshot(root: Path) -> dict[str, object]:
    """Every path under ``root`` (links not followed) -> file bytes, link target or 'dir'."""
    out: dict[str, object] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(top, name)
            rel = str(p.relative_to(root))
            out[rel] = ("link", os.readlink(p)) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def checkout(root: Path) -> Path:
    """A project checkout, the kind of directory pointed at by mistake."""
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".git" / "objects" / "ab").write_bytes(b"\x78\x9c blob")
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print('precious')\n")
    (root / "README.md").write_text("# project\n")
    return root


def marked_run(root: Path) -> Path:
    """What a run writes: the marker (from prepare_run_dir), configs, metrics, TensorBoard, trajectories, checkpoints."""
    assert prepare_run_dir(root, resume=False, overwrite=False) is None
    (root / "config.json").write_text("{}\n")
    (root / "config.20250101-120000.json").write_text('{"lr": 2}\n')
    (root / "metrics.jsonl").write_text('{"step": 1}\n')
    (root / "tb").mkdir()
    (root / "tb" / "events.out.tfevents.1.host").write_bytes(b"\0events")
    (root / "trajectories").mkdir()
    (root / "trajectories" / "step_000001.parquet").write_bytes(b"PAR1")
    ck = root / "checkpoints" / "step_1-abcd1234"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text("{}")
    (root / "checkpoints" / "latest").write_text(ck.name + "\n")
    return root


@pytest.fixture
def away(tmp_path, monkeypatch):
    """Work from a directory beside the ones under test (the cwd guard is not what refuses here)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


@pytest.fixture
def no_models(monkeypatch):
    """A model load fails the test: bad input must be found before."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    for target in ("ziprl.policy.make_engine", "ziprl.learner.trainer.Trainer.__init__"):
        monkeypatch.setattr(target, refuse)


@pytest.mark.parametrize("main", [train.main, launch.main], ids=["train", "launch"])
def test_overwrite_refuses_a_directory_that_is_not_a_run(main, away, capsys, no_models):
    """The reproduction: --overwrite pointed at a project checkout deleted it, .git included."""
    proj = checkout(away / "project")
    before = snapshot(proj)
    assert main(["--out", str(proj), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"no {MARKER} marker" in err, err
    assert ".git" in err, err
    assert "delete it yourself" in err, err
    assert snapshot(proj) == before


def test_overwrite_replaces_a_marked_run(away):
    run = marked_run(away / "run")
    assert "command" in json.loads((run / MARKER).read_text())  # the marker says what made the run
    assert prepare_run_dir(run, resume=False, overwrite=True, command="again") is None
    assert [p.name for p in run.iterdir()] == [MARKER]
    assert read_marker(run)["command"] == "again"
    assert read_marker(run)["format"] == 1


@pytest.mark.parametrize("where", ["tb", "checkpoints/step_1-abcd1234/extra"])
def test_overwrite_never_follows_a_symlink_out_of_the_run(where, away):
    outside = away / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "data.bin").write_bytes(b"precious")
    (outside / "deep" / "x.txt").write_text("precious")
    run = marked_run(away / "run")
    link = run / where
    if link.is_dir():
        shutil.rmtree(link)
    link.symlink_to(outside, target_is_directory=True)
    before, outside_before = snapshot(run), snapshot(outside)
    with pytest.raises(OutputError, match=f"holds links \\({where}\\)"):
        prepare_run_dir(run, resume=False, overwrite=True)
    assert snapshot(outside) == outside_before
    assert snapshot(run) == before


def test_out_may_be_a_symlink_to_a_marked_run(away):
    run = marked_run(away / "run")
    (away / "link").symlink_to(run, target_is_directory=True)
    assert prepare_run_dir(away / "link", resume=False, overwrite=True) is None
    assert (away / "link").is_symlink()
    assert [p.name for p in run.iterdir()] == [MARKER]
    proj = checkout(away / "project")
    (away / "plink").symlink_to(proj, target_is_directory=True)
    before = snapshot(proj)
    with pytest.raises(OutputError, match="no .ziprl-run marker"):
        prepare_run_dir(away / "plink", resume=False, overwrite=True)
    assert snapshot(proj) == before


def test_a_fresh_run_is_marked_and_a_bare_marker_is_no_run(away):
    out = away / "fresh"
    assert prepare_run_dir(out, resume=False, overwrite=False) is None
    marker = read_marker(out)
    assert marker["format"] == 1
    assert marker["created"]
    assert isinstance(marker["command"], str)
    assert prepare_run_dir(out, resume=False, overwrite=False) is None  # a run that wrote nothing: reused


@pytest.mark.parametrize("main", [train.main, launch.main], ids=["train", "launch"])
def test_bad_input_is_reported_before_the_run_is_deleted(main, away, capsys, no_models):
    """The reproduction: --overwrite deleted the run, then reported the missing dataset."""
    run = marked_run(away / "run")
    before = snapshot(run)
    assert main(["--out", str(run), "--overwrite", "--set", f"data.dataset={away / 'missing.jsonl'}"]) == 2
    assert "does not exist; pass a dataset" in capsys.readouterr().err
    assert snapshot(run) == before


@pytest.mark.parametrize("setting", ["retriever.corpus=NOPE", "retriever.index_dir=NOPE", "retriever.encoder=NOPE",
                                     "model.path=NOPE", "run.sft_checkpoint=NOPE"])
def test_every_input_path_is_checked_before_the_run_is_deleted(setting, away, capsys, no_models):
    run = marked_run(away / "run")
    before = snapshot(run)
    assert train.main(["--out", str(run), "--overwrite", "--set", setting.replace("NOPE", str(away / "nope"))]) == 2
    assert str(away / "nope") in capsys.readouterr().err
    assert snapshot(run) == before


NAME = st.one_of(st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=12),
                st.binary(min_size=1, max_size=8).filter(lambda b: b"/" not in b and b"\0" not in b).map(os.fsdecode),
                ).filter(lambda n: n not in (".", ".."))  # odd Unicode, and bytes that are not UTF-8 at all
TREE = st.recursive(st.binary(max_size=8), lambda kids: st.dictionaries(NAME, kids, min_size=1, max_size=4),
                    max_leaves=12)


def build(root: Path, tree: dict) -> None:
    for name, sub in tree.items():
        if isinstance(sub, dict):
            (root / name).mkdir()
            build(root / name, sub)
        else:
            (root / name).write_bytes(sub)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.dictionaries(NAME, TREE, min_size=1, max_size=5), marked=st.booleans())
def test_overwrite_never_removes_anything_that_is_not_a_marked_run(tree, marked, away):
    """Any tree (odd Unicode names included) without the marker, or with it and a foreign entry, is left whole."""
    tree = {k: v for k, v in tree.items() if k != MARKER}
    assume(tree or marked)
    if marked:
        tree = {**tree, MARKER: b'{"format": 1}', "foreign\u202e\U0001f600": b"x"}
    root = away / uuid.uuid4().hex
    root.mkdir()
    build(root, tree)
    before = snapshot(root)
    with pytest.raises(OutputError, match="nothing was deleted"):
        prepare_run_dir(root, resume=False, overwrite=True)
    assert snapshot(root) == before


@requires_deepspeed
def test_resume_keeps_what_a_killed_write_did_not_leave(run_dir, tmp_path):
    """Only the names atomic writes give their temporary files are cleaned: a user's look-alikes stay."""
    out = copy_run(run_dir, tmp_path)
    root = out / "checkpoints"
    (root / ".latest.bak").write_text("mine")
    (root / ".step_mine").mkdir()
    (root / ".step_mine" / "keep").write_text("mine")
    prepare_run_dir(out, resume=True, overwrite=False)
    assert (root / ".latest.bak").read_text() == "mine" and (root / ".step_mine" / "keep").read_text() == "mine"


@requires_deepspeed
def test_resume_with_nothing_left_to_train_is_refused(run_dir, tmp_path, capsys):
    """The checkpoint is at step 1: --steps 1 would load the model, train nothing and report success."""
    out = copy_run(run_dir, tmp_path)
    with pytest.raises(OutputError, match=r"is at step 1 already .*pass --steps greater than 1"):
        plan_run_dir(out, resume=True, overwrite=False, steps=1)
    assert plan_run_dir(out, resume=True, overwrite=False, steps=2).resume_from == latest_checkpoint(out)
    assert train.main(["--out", str(out), "--resume", "--steps", "1"]) == 2
    assert "is at step 1 already" in capsys.readouterr().err


@requires_deepspeed
def test_a_lost_latest_pointer_points_to_the_checkpoint_that_is_left(run_dir, tmp_path):
    """Not --overwrite, which would delete the complete checkpoint still there."""
    out = copy_run(run_dir, tmp_path)
    name = latest_checkpoint(out).name
    (out / "checkpoints" / "latest").unlink()
    with pytest.raises(OutputError, match=rf"resume from it with `echo {name} > .*latest`") as err:
        prepare_run_dir(out, resume=True, overwrite=False)
    assert "pass --overwrite" in str(err.value)  # offered second


def test_a_finished_sft_is_not_sent_to_overwrite(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(OutputError, match=rf"SFT run finished: its model is {tmp_path / 'model'}"):
        plan_run_dir(tmp_path, resume=True, overwrite=False, kind="sft")


@requires_deepspeed
@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl"])
def test_resume_names_a_run_file_that_is_not_a_file(name, run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    (out / name).mkdir()
    with pytest.raises(OutputError, match=rf"{out / name} is not a file"):
        prepare_run_dir(out, resume=True, overwrite=False)


@requires_deepspeed
@pytest.mark.parametrize("field,value", [("step", "x"), ("step", True), ("step", -1), ("data_position", "x"),
                                         ("optimizer", [])])
def test_resume_refuses_state_fields_of_the_wrong_type(field, value, run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    state = latest_checkpoint(out) / "state.json"
    state.write_text(json.dumps(json.loads(state.read_text()) | {field: value}))
    with pytest.raises(OutputError, match=rf"state.json's {field} is not what a checkpoint write puts there"):
        prepare_run_dir(out, resume=True, overwrite=False)


@pytest.mark.parametrize("where,named", [("notes.txt", None), ("checkpoints/notes.txt", None),
                                         ("checkpoints/step_1-abcd1234/mine.bin", None),
                                         ("checkpoints/.step_mine/keep", "checkpoints/.step_mine"),
                                         ("trajectories/my_analysis.ipynb", None), ("trajectories/dropped/x.csv", None),
                                         ("tb/mine/keep", "tb/mine"), ("tb/notes", None)])
def test_overwrite_refuses_a_run_holding_a_foreign_file(where, named, away):
    """A file a user put in the run, or inside checkpoints/, trajectories/ or tb/, is not deleted with the directory;
    a foreign directory is named, not its contents."""
    run = marked_run(away / "run")
    (run / where).parent.mkdir(parents=True, exist_ok=True)
    (run / where).write_text("mine")
    before = snapshot(run)
    with pytest.raises(OutputError, match=rf"a train/launch run does not write \({named or where}\); nothing was "
                                          "deleted: move them out"):
        prepare_run_dir(run, resume=False, overwrite=True)
    assert snapshot(run) == before


def test_overwrite_replaces_every_entry_a_run_writes_deep_inside(away):
    run = marked_run(away / "run")
    for rel in ("trajectories/dropped/step_000001.parquet", "checkpoints/step_1-abcd1234/model.safetensors",
                "checkpoints/.step_2-abcd1234.k2j_h4xz/model.safetensors", "checkpoints/.latest.0123abcd.tmp",
                ".metrics.jsonl.0123abcd.tmp"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(b"ziprl")
    assert prepare_run_dir(run, resume=False, overwrite=True) is None
    assert [p.name for p in run.iterdir()] == [MARKER]
