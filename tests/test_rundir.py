"""Run directories and checkpoints: nothing of an earlier run is lost (issue 14, item 1)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.test_trainer import make_cfg, requires_deepspeed
from ziprl.learner.checkpoint import clean_orphans, latest_checkpoint, save_checkpoint, verify_checkpoint
from ziprl.rundir import RunDirError, prepare_run_dir, write_config

pytestmark = [requires_deepspeed]


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


def test_a_second_run_in_the_same_dir_loses_nothing(trainer, tmp_path):
    """The reproduction: run A writes steps 1-3, run B's step 1 then repointed `latest` at a pruned directory."""
    old = []
    for step in (1, 2, 3):
        trainer.global_step = step
        old.append(save_checkpoint(trainer, tmp_path, {"run": "a"}, keep=2))
    trainer.global_step = 1
    new = save_checkpoint(trainer, tmp_path, {"run": "b"}, keep=2)
    assert latest_checkpoint(tmp_path) == new and verify_checkpoint(new)  # `latest` names a complete checkpoint
    assert new not in old and old[2].is_dir()  # names never collide; the newest-written are kept
    assert json.loads((new / "state.json").read_text())["data_position"] == {"run": "b"}
    assert json.loads((old[2] / "state.json").read_text())["data_position"] == {"run": "a"}


def test_a_non_empty_dir_needs_resume_or_overwrite(run_dir, tmp_path):
    with pytest.raises(RunDirError, match="--resume to continue.*--overwrite"):
        prepare_run_dir(run_dir, resume=False, overwrite=False)
    assert prepare_run_dir(tmp_path / "new", resume=False, overwrite=False) is None and (tmp_path / "new").is_dir()
    out = copy_run(run_dir, tmp_path)
    assert prepare_run_dir(out, resume=False, overwrite=True) is None and not any(out.iterdir())
    with pytest.raises(RunDirError, match="contradict"):
        prepare_run_dir(out, resume=True, overwrite=True)


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    with pytest.raises(RunDirError, match="holds no run to resume"):
        prepare_run_dir(tmp_path / "none", resume=True, overwrite=False)
    (tmp_path / "logs").mkdir()
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunDirError, match="no checkpoint to resume from"):
        prepare_run_dir(tmp_path, resume=True, overwrite=False)


def test_resume_returns_the_verified_latest_and_cleans_killed_writes(run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    root = out / "checkpoints"
    (root / ".step_2-deadbeef.tmpxyz").mkdir()  # what a killed write leaves
    (root / ".step_2-deadbeef.tmpxyz" / "model.safetensors").write_bytes(b"partial")
    (root / ".latest.tmp").write_text("step_2-deadbeef\n")
    assert prepare_run_dir(out, resume=True, overwrite=False) == latest_checkpoint(out)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    assert clean_orphans(out) == []


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
    with pytest.raises(RunDirError, match="--resume: .*--overwrite"):
        prepare_run_dir(out, resume=True, overwrite=False)


def test_a_resumed_run_keeps_the_old_config(tmp_path):
    first = write_config(tmp_path, {"lr": 1})
    assert write_config(tmp_path, {"lr": 1}) == first  # same config: same file
    second = write_config(tmp_path, {"lr": 2})
    assert second != first and json.loads(first.read_text()) == {"lr": 1}
    assert json.loads(second.read_text()) == {"lr": 2}


def test_overwrite_refuses_to_delete_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "precious.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunDirError, match="working or home directory"):
        prepare_run_dir(tmp_path, resume=False, overwrite=True)
    assert (tmp_path / "precious.txt").is_file()
