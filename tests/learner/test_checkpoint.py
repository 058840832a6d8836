"""Checkpoints resume exactly: same loss and weights at the next step, same RNG draws, same data position."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch

from ziprl.learner.checkpoint import (
    CheckpointError,
    export_model,
    latest_checkpoint,
    load_checkpoint,
    remove_checkpoints,
    resumed_learner,
    save_checkpoint,
)
from ziprl.learner.trainer import Trainer
from ziprl.testing.learner import make_cfg, make_groups, requires_deepspeed

pytestmark = [pytest.mark.slow, requires_deepspeed]


@pytest.fixture(scope="module")
def batches(tiny_model_dir):
    return [make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=2, seed=s) for s in range(3)]


def rng_draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


@pytest.mark.parametrize(("save_stage", "load_stage"), [(0, 0), (2, 2), (3, 3), (2, 0)])
def test_resume_is_exact(save_stage, load_stage, tiny_model_dir, batches, tmp_path):
    def trainer(stage: int) -> Trainer:
        return Trainer(make_cfg(zero_stage=stage, lr=1e-3, warmup_steps=3, beta=0.001, micro_batch_turns=3),
                       tiny_model_dir)

    run = trainer(save_stage)
    for groups in batches[:2]:
        run.train_step(groups)
    path = save_checkpoint(run, tmp_path, {"cursor": 17, "epoch": 1})
    draws = rng_draws()
    third = run.train_step(batches[2])
    weights = run.named_weights_numpy()

    resumed = trainer(load_stage)
    assert load_checkpoint(resumed, tmp_path) == {"cursor": 17, "epoch": 1}
    assert rng_draws() == draws
    assert (resumed.global_step, resumed.policy_version, resumed.lr) == (2, 2, run.lr)
    again = resumed.train_step(batches[2])
    for key in ("loss", "kl", "lr", "tokens"):
        assert again[key] == pytest.approx(third[key], rel=1e-6, abs=1e-9), key
    # ZeRO and torch sum the squared gradients in different orders: the norms agree to float32 round-off
    assert again["grad_norm"] == pytest.approx(third["grad_norm"], rel=1e-6 if save_stage == load_stage else 1e-5)
    for name, value in resumed.named_weights_numpy().items():
        np.testing.assert_allclose(value, weights[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert path.parent == tmp_path / "checkpoints"
    assert path.name.startswith("step_2-")
    assert latest_checkpoint(tmp_path) == path


def test_layout_latest_pointer_and_retention(tiny_model_dir, batches, tmp_path):
    assert latest_checkpoint(tmp_path) is None
    run = Trainer(make_cfg(beta=0.0), tiny_model_dir)
    paths = []
    for step in range(3):
        run.train_step(batches[step])
        paths.append(save_checkpoint(run, tmp_path, {"step": step}, keep=2))
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == sorted(["latest", paths[1].name, paths[2].name])
    assert latest_checkpoint(tmp_path) == paths[2]
    files = sorted(p.name for p in paths[2].iterdir())
    assert files == ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"]
    state = json.loads((paths[2] / "state.json").read_text())
    assert state["step"] == 3
    assert state["data_position"] == {"step": 2}
    assert state["optimizer"]["step"] == 3.0
    assert load_checkpoint(Trainer(make_cfg(beta=0.0), tiny_model_dir), paths[1]) == {"step": 1}
    with pytest.raises(FileNotFoundError):
        load_checkpoint(run, tmp_path / "nowhere")


def test_retention_follows_run_keep_checkpoints(tiny_model_dir, batches, tmp_path):
    """``run.keep_checkpoints`` decides how many stay when the caller does not say; 0 keeps every one."""
    for keep, expected in ((2, 2), (0, 3)):
        cfg = make_cfg(beta=0.0)
        cfg.run.keep_checkpoints = keep
        run, out = Trainer(cfg, tiny_model_dir), tmp_path / f"keep{keep}"
        for step in range(3):
            run.train_step(batches[step])
            save_checkpoint(run, out, {"step": step})
        names = sorted(p.name.split("-")[0] for p in (out / "checkpoints").iterdir() if p.name != "latest")
        assert names == [f"step_{s}" for s in range(4 - expected, 4)]


def test_export_model_loads_the_checkpoint_weights(tiny_model_dir, batches, tmp_path):
    """An exported checkpoint is an HF model directory with the trained weights and the base's tokenizer."""
    from transformers import AutoModelForCausalLM

    run = Trainer(make_cfg(beta=0.0, lr=1e-2), tiny_model_dir)
    run.train_step(batches[0])
    path = save_checkpoint(run, tmp_path, {})
    out = export_model(path, tiny_model_dir, tmp_path / "exported")
    trained = run.named_weights_numpy()
    model = AutoModelForCausalLM.from_pretrained(out)
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), trained[name], err_msg=name)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any(not torch.equal(p, q) for p, q in zip(base.parameters(), model.parameters(), strict=True))
    assert (out / "tokenizer.json").is_file() or (out / "tokenizer_config.json").is_file()
    with pytest.raises(CheckpointError, match="no config.json"):
        export_model(path, tmp_path, tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


def test_export_model_never_replaces_what_it_did_not_write(tiny_model_dir, batches, tmp_path):
    """An existing --out is replaced only with ``overwrite`` and only when an earlier export wrote it and it holds
    nothing else: a user's directory or file, or an export the user added a file to, is refused, untouched."""
    from ziprl.outputs import OutputError

    run = Trainer(make_cfg(beta=0.0, lr=1e-2), tiny_model_dir)
    run.train_step(batches[0])
    path = save_checkpoint(run, tmp_path / "run", {})
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    for target in (mine, tmp_path / "file"):
        for overwrite in (False, True):
            with pytest.raises(OutputError, match="is not a model directory export_model wrote"):
                export_model(path, tiny_model_dir, target, overwrite=overwrite)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (tmp_path / "file").read_text() == "mine"
    out = export_model(path, tiny_model_dir, tmp_path / "exported")
    with pytest.raises(OutputError, match="pass overwrite=True"):
        export_model(path, tiny_model_dir, out)
    assert export_model(path, tiny_model_dir, out, overwrite=True) == out
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="also holds notes.txt"):
        export_model(path, tiny_model_dir, out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()


@pytest.mark.parametrize(("stored", "resume", "set_bf16", "expected"), [
    (True, True, None, True), (False, True, None, False),  # null: the checkpoint's decision
    (True, False, None, None),  # a fresh run measures
    (True, True, False, False),  # set by the user: kept
    (None, True, None, None),  # a checkpoint written before the decision was stored: measured again
])
def test_a_resumed_run_takes_its_checkpoints_compute_dtype(tmp_path, stored, resume, set_bf16, expected):
    ckpt = tmp_path / "checkpoints" / "step_2-0123abcd"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 2} | ({} if stored is None else {"bf16": stored})))
    (tmp_path / "checkpoints" / "latest").write_text(ckpt.name)
    cfg = make_cfg(bf16=set_bf16)
    cfg.run.out_dir, cfg.run.resume = str(tmp_path), resume
    assert resumed_learner(cfg).learner.bf16 is expected
    assert cfg.learner.bf16 is set_bf16  # the given config is left as it was


def test_a_snapshot_copies_the_trainer_unless_it_is_written_at_once(tiny_model_dir, batches):
    """``snapshot`` (for a background write) holds copies the next step cannot change; ``copy=False`` (a write
    that ends before the trainer steps: ``save_checkpoint``) holds a CPU trainer's own float32 tensors."""
    from ziprl.learner.checkpoint import snapshot

    run = Trainer(make_cfg(lr=1e-3), tiny_model_dir)
    run.train_step(batches[0])
    params = dict(run.engine.module.named_parameters())
    copied, held = snapshot(run, "unused", {}), snapshot(run, "unused", {}, copy=False)
    for name, p in params.items():
        assert held.files["model.safetensors"][name].data_ptr() == p.data_ptr()
        assert copied.files["model.safetensors"][name].data_ptr() != p.data_ptr()
        assert torch.equal(copied.files["model.safetensors"][name], p.detach())
    moments = copied.files["optimizer.safetensors"]
    assert len(moments) == 2 * len(params)
    assert all(t.dtype == torch.float32 for t in moments.values())


def test_pruning_and_removal_keep_what_a_user_put_among_the_checkpoints(tiny_model_dir, tmp_path):
    """Retention skips a checkpoint holding a user's file; an SFT's removal of its checkpoints keeps a user's files
    and the directory holding them."""
    run = Trainer(make_cfg(beta=0.0), tiny_model_dir)
    first = save_checkpoint(run, tmp_path, {}, keep=0)
    (first / "notes.txt").write_text("mine")
    for step in (2, 3):
        run.global_step = step
        last = save_checkpoint(run, tmp_path, {}, keep=1)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == sorted([first.name, last.name, "latest"])
    (root / "mine.txt").write_text("mine")
    (root / ".step_2-abcd1234.k2j_h4xz").mkdir()  # a killed write's: removed with the checkpoints
    remove_checkpoints(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == sorted([first.name, "mine.txt"])
    assert (first / "notes.txt").read_text() == "mine"
    (root / "mine.txt").unlink()
    shutil.rmtree(first)
    remove_checkpoints(tmp_path)
    assert not root.exists()


def test_a_checkpoint_of_other_shapes_is_refused_before_anything_is_loaded(tiny_model_dir, tmp_path):
    """Same parameter names, other sizes (a model of another width): one error naming the fix, not a RuntimeError
    from a copy."""
    from safetensors.torch import load_file, save_file

    run = Trainer(make_cfg(beta=0.0), tiny_model_dir)
    path = save_checkpoint(run, tmp_path, {})
    weights = load_file(path / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name][..., :-1].contiguous()
    save_file(weights, path / "model.safetensors")
    before = {n: p.detach().clone() for n, p in run.engine.module.named_parameters()}
    with pytest.raises(CheckpointError, match=rf"its shapes differ \({name} .*resume with the model the run started"):
        load_checkpoint(run, tmp_path)
    assert all(torch.equal(p, before[n]) for n, p in run.engine.module.named_parameters())


def test_a_prune_cut_short_leaves_an_orphan_that_the_next_resume_removes(tmp_path, monkeypatch):
    """A checkpoint is renamed to an orphan's name before it is deleted: killed half way through the delete (here:
    the delete never runs), what is left is removed by clean_orphans instead of staying for good."""
    from ziprl.learner import checkpoint as ck

    root = tmp_path / "checkpoints"
    for step in (1, 2):
        (root / f"step_{step}-0a1b2c3d").mkdir(parents=True)
        for name in ck.FILES:
            (root / f"step_{step}-0a1b2c3d" / name).write_text("{}")
    (root / ck.LATEST).write_text("step_2-0a1b2c3d\n")
    monkeypatch.setattr(ck.shutil, "rmtree", lambda *a, **k: None)  # killed before the delete
    ck.prune(root, keep=1)
    left = sorted(p.name for p in root.iterdir())
    assert left[0].startswith(".step_1-0a1b2c3d.old-") and left[1:] == [ck.LATEST, "step_2-0a1b2c3d"]
    monkeypatch.undo()
    assert [p.name for p in ck.clean_orphans(tmp_path)] == [left[0]]
    assert sorted(p.name for p in root.iterdir()) == [ck.LATEST, "step_2-0a1b2c3d"]
