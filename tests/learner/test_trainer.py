"""The DeepSpeed trainer on CPU: gradients equal a plain-torch reference (any ZeRO stage, any micro-batch
count), a real GRPO step on the default model lowers the loss, weights go out whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tests.conftest import REPO, requires_cpu_bf16
from ziprl.config import ZipRLConfig
from ziprl.env.group import Group
from ziprl.learner.advantages import compute_advantages
from ziprl.learner.batch import build_rows, make_micro_batches, response_logprobs
from ziprl.learner.losses.ppo_clip import policy_loss
from ziprl.learner.packing import packing_pays, pair_cost
from ziprl.learner.trainer import Trainer, shares_prefix, tis_cap
from ziprl.policy.models import load_model, load_tokenizer
from ziprl.testing.learner import (
    behaviour_logprobs,
    make_cfg,
    make_groups,
    model_and_tokenizer,
    requires_deepspeed,
)

pytestmark = [pytest.mark.slow, requires_deepspeed]


def reference_step(model_dir: Path, weights: dict[str, np.ndarray], groups, cfg: ZipRLConfig):
    """Plain torch: the whole batch in ONE micro-batch, loss.backward(); returns (flat grads, loss)."""
    model = load_model(model_dir).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(weights[name]))
    adv = compute_advantages(groups, cfg.learner)
    rows = build_rows(adv.trajectories, adv.turn_advantages, cfg.learner.loss_norm)
    (mb,) = make_micro_batches(rows, len(rows), pad_id=model_and_tokenizer(model_dir)[1].pad_token_id)
    logp = response_logprobs(model, mb)
    loss, _ = policy_loss(logp, mb.old_logp, mb.adv, mb.weight, mb.loss_mask, clip_eps=cfg.learner.clip_eps)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]), loss.item()


def capture_grads(trainer: Trainer) -> list[torch.Tensor]:
    """Record the gradients AdamW sees (reduced; ZeRO's flat partitions) at every optimiser step."""
    seen: list[torch.Tensor] = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(
            torch.cat([p.grad.detach().flatten().clone() for g in opt.param_groups for p in g["params"]])))
    return seen


@pytest.fixture(scope="module")
def grad_batches(tiny_model_dir) -> list[list[Group]]:
    return [  # 9 turns -> 5 micro-batches of 2, then 2 turns -> 1 micro-batch
        make_groups(tiny_model_dir, groups=2, group_size=3, max_turns=2, logprob_noise=0.3),
        make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=1, seed=1),
    ]


@pytest.mark.parametrize(("stage", "checkpointing", "tokens"),
                         [(0, False, 0), (1, False, 0), (2, False, 0), (3, False, 0), (0, True, 0),
                          (0, False, 200), (3, False, 200)])  # 200 tokens: passes of 3, 3, 2 and 1 turns
def test_gradients_equal_plain_torch_with_variable_micro_batches(stage, checkpointing, tokens, tiny_model_dir,
                                                                 grad_batches):
    cfg = make_cfg(zero_stage=stage, micro_batch_turns=2, lr=1e-2, beta=0.0, max_grad_norm=0.0,
                   gradient_checkpointing=checkpointing, micro_batch_tokens=tokens)
    trainer = Trainer(cfg, tiny_model_dir)
    assert trainer.reference is None  # beta = 0: no reference model is loaded
    seen = capture_grads(trainer)
    for step, groups in enumerate(grad_batches, 1):
        ref_grad, ref_loss = reference_step(tiny_model_dir, trainer.named_weights_numpy(), groups, cfg)
        stats = trainer.train_step(groups)
        got = seen[-1]
        assert got[: ref_grad.numel()].allclose(ref_grad, rtol=1e-4, atol=1e-6 * float(ref_grad.abs().max()))
        assert not got[ref_grad.numel():].any()  # ZeRO's alignment padding only
        assert stats["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-8)
        assert stats["grad_norm"] == pytest.approx(float(ref_grad.norm()), rel=1e-4)
        assert stats["kl"] == 0.0
        assert trainer.policy_version == step
        # 9 turns, 2 a pass, then 2: with 200 tokens the plan could take 3 in a pass, but pairs cost fewer tokens
        assert stats["passes"] == [5, 1][step - 1]
        if step == 1:
            assert stats["clip_frac"] > 0  # the perturbed behaviour log-probs exercise the clipped branch


def test_default_model_grpo_step_lowers_loss(default_model_dir, tmp_path):
    cfg = make_cfg(lr=1e-5, beta=0.001, micro_batch_turns=4)
    trainer = Trainer(cfg)  # model_path None -> the embedded default
    assert trainer.model_path == default_model_dir
    assert trainer.reference is not None
    groups = make_groups(default_model_dir, groups=2, group_size=4, max_turns=2)
    before = trainer.named_weights_numpy()

    first = trainer.train_step(groups)
    second = trainer.train_step(groups)  # its loss is measured before its own update
    keys = {"loss", "clip_frac", "kl", "entropy", "adv_mean", "adv_std", "hrr_abs_mean", "zero_variance_frac",
            "grad_norm", "lr", "tokens", "seconds"}
    assert keys <= set(first)
    assert all(np.isfinite(first[k]) for k in keys)
    assert first["clip_frac"] == 0.0
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # rho = 1, policy = reference
    assert second["loss"] < first["loss"] - 1e-4
    assert second["kl"] > 0
    assert first["entropy"] > 0
    assert first["lr"] == 1e-5
    assert trainer.policy_version == 2

    after = trainer.named_weights_numpy()
    assert set(after) == set(before)
    assert all(a.dtype == np.float32 for a in after.values())
    assert any(not np.array_equal(before[k], after[k]) for k in after)
    saved = trainer.save_pretrained(tmp_path / "policy")
    reloaded = load_model(saved)
    for name, p in reloaded.named_parameters():
        assert np.array_equal(p.detach().numpy(), after[name]), name
    assert load_tokenizer(saved).eos_token == trainer.tokenizer.eos_token
    with safe_open(saved / "model.safetensors", "pt") as f:  # tied embeddings written once, as from_pretrained's
        names = set(f.keys())
    assert "lm_head.weight" not in names
    assert "model.embed_tokens.weight" in names


def test_the_first_step_takes_the_reference_log_probs_from_the_policy_itself(tiny_model_dir, tmp_path):
    """While the policy's weights are the reference's (no update yet, no checkpoint loaded) its own log-probs are the
    reference's: the first step runs no reference forward and takes the step the reference model gives (float32:
    the same numerics); a later step, and the first step after a checkpoint load, run the reference model."""
    from ziprl.learner.checkpoint import load_checkpoint, save_checkpoint

    groups = make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=2, logprob_noise=0.3)
    calls: list[int] = []

    def trainer() -> Trainer:
        built = Trainer(make_cfg(lr=1e-3, beta=0.1), tiny_model_dir)
        built.reference.register_forward_hook(lambda *_: calls.append(1))
        return built

    run = trainer()
    first = run.train_step(groups)
    assert not calls
    assert first["kl"] == 0.0
    forced = trainer()
    forced.at_reference = False
    check = forced.train_step(groups)
    assert calls
    assert check["loss"] == pytest.approx(first["loss"], rel=1e-6, abs=1e-9)
    assert check["kl"] == pytest.approx(0.0, abs=1e-7)
    ours, theirs = run.named_weights_numpy(), forced.named_weights_numpy()
    assert all(np.allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-7) for k in ours)

    calls.clear()
    second = run.train_step(groups)
    assert calls
    assert second["kl"] > 0
    save_checkpoint(run, tmp_path, {})
    resumed = trainer()
    load_checkpoint(resumed, tmp_path)
    calls.clear()
    assert resumed.train_step(groups)["kl"] > 0
    assert calls


def test_a_step_runs_the_prefix_its_turns_share_once(tiny_model_dir):
    """Turns over five micro-batches share a prefix (the chat template's lead and "Question "): the policy and the
    reference model each run it once per step (it was once per micro-batch), and the step equals one that shares
    no prefix (float32): loss, KL, trained tokens and the gradient."""
    groups = make_groups(tiny_model_dir, groups=2, group_size=3, max_turns=2, logprob_noise=0.3)
    runs = {}
    for share in (True, False):
        trainer = Trainer(make_cfg(micro_batch_turns=2, beta=0.1, share_prefix=share, probe_update=False),
                          tiny_model_dir)
        trainer.at_reference = False  # run the reference model, as after the first update: one that differs
        noise = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in trainer.reference.parameters():
                p.add_(torch.randn(p.shape, generator=noise), alpha=0.02)
        widths = {"policy": [], "reference": []}
        for name, model in (("policy", trainer.engine.module), ("reference", trainer.reference)):
            model.register_forward_pre_hook(
                lambda _, args, kwargs, seen=widths[name]: seen.append(tuple(kwargs["input_ids"].shape)),
                with_kwargs=True)
        seen = capture_grads(trainer)
        runs[share] = (trainer.train_step(groups), widths, seen[0])
    (shared, widths, grad), (plain, plain_widths, plain_grad) = runs[True], runs[False]
    assert shared["passes"] == plain["passes"] == 5
    s = widths["policy"][0][1]  # the first forward runs the prefix: [1, S]
    for name in widths:  # then per micro-batch its rows, after one row through the tokens they share beyond it (if any)
        assert widths[name][0] == (1, s), widths[name]
        assert len(plain_widths[name]) == 5, widths[name]
        assert 5 < len(widths[name]) - 1 < 10, widths[name]
        assert widths[name] == widths["policy"], widths[name]
    # 9 turns: the step's prefix once saves s tokens a turn but one; the micro-batches' own shared tokens save more
    assert s > 0
    assert plain["computed_tokens"] - shared["computed_tokens"] > s * (9 - 1)
    assert shared["kl"] > 1e-4
    for key in ("loss", "kl", "trained_tokens", "tokens"):
        assert shared[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-8), key
    assert grad.allclose(plain_grad, rtol=1e-4, atol=1e-6 * float(plain_grad.abs().max()))


def test_micro_batches_run_packed_on_a_cpu_where_it_pays_and_the_step_is_the_same(tiny_model_dir, monkeypatch):
    """On a CPU (``learner.pack_rows`` null) a micro-batch runs packed exactly where packing computes less
    (:func:`packing_pays`; the tiny model's attention is costly beside its narrow layers, so a near-free attention is
    patched in to make it pay); packed or not, the step's loss, KL and gradient are the same (float32)."""
    from ziprl.learner import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "pair_cost", lambda config: 1e-9)
    groups = make_groups(tiny_model_dir, groups=2, group_size=3, max_turns=2, logprob_noise=0.3)
    runs = {}
    for setting in (None, False):
        trainer = Trainer(make_cfg(micro_batch_turns=4, beta=0.1, pack_rows=setting, probe_update=False),
                          tiny_model_dir)
        trainer.at_reference = False  # a reference that differs: the KL term is not 0
        noise = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in trainer.reference.parameters():
                p.add_(torch.randn(p.shape, generator=noise), alpha=0.02)
        adv = compute_advantages(groups, trainer.cfg.learner)
        rows = build_rows(adv.trajectories, adv.turn_advantages, trainer.cfg.learner.loss_norm)
        batches = [mb for mb, _ in trainer.micro_batches(rows)[0]]
        pays = [packing_pays(mb.response_ends, mb.prefix_len, 1e-9) for mb in batches]
        assert [mb.packed for mb in batches] == (pays if setting is None else [False] * len(batches))
        seen = capture_grads(trainer)
        runs[setting] = (trainer.train_step(groups), seen[0], pays)
    (packed, grad, pays), (plain, plain_grad, _) = runs[None], runs[False]
    assert any(pays)
    assert not packing_pays(batches[0].response_ends, batches[0].prefix_len, pair_cost(trainer.engine.module.config))
    assert packed["kl"] > 0
    for key in ("loss", "kl", "trained_tokens", "tokens"):
        assert packed[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-8), key
    assert grad.allclose(plain_grad, rtol=1e-4, atol=1e-6 * float(plain_grad.abs().max()))


def test_all_zero_variance_groups_dropped_takes_no_step(tiny_model_dir):
    trainer = Trainer(make_cfg(beta=0.0, drop_zero_variance_groups=True), tiny_model_dir)
    groups = make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=1)
    for t in (t for g in groups for t in g):
        t.reward = 1.0
    stats = trainer.train_step(groups)
    assert stats["skipped"] == 1.0
    assert stats["zero_variance_frac"] == 1.0
    assert trainer.policy_version == 0


def test_warmup_then_constant_lr(tiny_model_dir):
    trainer = Trainer(make_cfg(beta=0.0, lr=1e-3, warmup_steps=2), tiny_model_dir)
    groups = make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=1)
    lrs = [trainer.train_step(groups)["lr"] for _ in range(3)]
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3])




@requires_cpu_bf16
def test_bf16_on_cpu_trains_float32_masters_close_to_float32(tiny_model_dir):
    """bf16 autocast on the CPU: the same step as float32 within bf16 rounding, masters and optimizer in float32."""
    groups = make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=2)
    steps = {}
    for bf16 in (False, True):
        trainer = Trainer(make_cfg(bf16=bf16, lr=1e-3, beta=0.001, rollout_correction="off"), tiny_model_dir)
        steps[bf16] = (trainer.train_step(groups), trainer.named_weights_numpy(), trainer)
    (f32, w32, _), (b16, w16, trainer) = steps[False], steps[True]
    assert trainer.bf16
    assert b16["gemm_peak_tflops"] > 0
    assert 0 < b16["mfu"] < 1
    assert all(p.dtype == torch.float32 for p in trainer.engine.module.parameters())
    assert b16["loss"] == pytest.approx(f32["loss"], rel=0.05, abs=1e-3)
    assert b16["grad_norm"] == pytest.approx(f32["grad_norm"], rel=0.05)
    start = {k: v.numpy() for k, v in model_and_tokenizer(tiny_model_dir)[0].state_dict().items() if k in w32}
    moved32, moved16 = (np.concatenate([(w[k] - v).ravel() for k, v in start.items()]) for w in (w32, w16))
    assert np.corrcoef(moved32, moved16)[0, 1] > 0.95  # the same update direction


def test_rollout_correction_auto_follows_the_numerics():
    """auto: off only when the engine is HF float32 and the learner float32; tis/off force it."""
    cfg = ZipRLConfig()
    assert tis_cap(cfg, bf16=False) is None
    assert tis_cap(cfg, bf16=True) == cfg.learner.tis_cap
    cfg.model.dtype = "bfloat16"
    assert tis_cap(cfg, bf16=False) == cfg.learner.tis_cap
    cfg.model.dtype, cfg.learner.rollout_correction = "float32", "tis"
    assert tis_cap(cfg, bf16=False) == cfg.learner.tis_cap
    cfg.learner.rollout_correction = "off"
    assert tis_cap(cfg, bf16=True) is None


def test_step_logs_mismatch_timings_and_the_update_probe(tiny_model_dir):
    """Behaviour log-probs off by a known amount show as the mismatch; the probe sees positive-advantage tokens rise."""
    groups = make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=1, logprob_noise=0.0)
    for t in (t for g in groups for t in g):
        for u in t.turns:
            u.logprobs = [x - 0.25 for x in u.logprobs]
    trainer = Trainer(make_cfg(lr=1e-3, beta=0.0, rollout_correction="tis", tis_cap=2.0), tiny_model_dir)
    stats = trainer.train_step(groups)
    assert stats["mismatch_abs_mean"] == pytest.approx(0.25, abs=1e-3)
    assert stats["mismatch_abs_max"] == pytest.approx(0.25, abs=1e-3)
    assert stats["tis_mean"] == pytest.approx(np.exp(0.25), rel=1e-3)
    assert stats["clip_frac"] == 0.0  # the ratio is against the learner's own log-probs
    assert stats["dlogp_pos_adv"] > stats["dlogp_neg_adv"]  # the update favours positive-advantage tokens
    assert min(stats[f"{p}_seconds"] for p in ("forward", "backward", "optimizer")) > 0
    assert stats["trained_tokens"] >= stats["tokens"]
    assert 0 < stats["mfu"] < 1


def test_the_step_parts_are_timed_by_the_devices_clock(tiny_model_dir, monkeypatch):
    """Every part of the split reads the learner device's clock (on CUDA one that waits for queued kernels): a
    clock that ticks 1 per reading gives 1 s per part per micro-batch."""
    from ziprl.learner import trainer as trainer_module

    ticks = iter(range(1000))
    monkeypatch.setattr(trainer_module, "device_clock", lambda device: lambda: float(next(ticks)))
    groups = make_groups(tiny_model_dir, groups=1, group_size=4, max_turns=1)
    trainer = Trainer(make_cfg(lr=1e-3, beta=0.001, micro_batch_turns=2), tiny_model_dir)
    stats = trainer.train_step(groups)  # 4 turns: 2 micro-batches after the step's shared prefix
    parts = ("forward", "reference", "backward", "optimizer", "probe")
    assert [stats[f"{p}_seconds"] for p in parts] == [3.0, 3.0, 2.0, 1.0, 1.0]
    # readings: the start, 3 around the prefix (policy, reference), 4 per micro-batch, 2 around the optimizer, the end
    assert stats["seconds"] == 14.0


def test_the_update_probe_reads_a_micro_batch_with_advantages(tiny_model_dir):
    """Equal rewards (A_GRPO = 0) with w = 0.2: only the scored turns carry an advantage, and the first turns (the
    shortest, so the first micro-batch) carry none; the probe must measure the micro-batch that has them."""
    model, _ = model_and_tokenizer(tiny_model_dir)
    groups = make_groups(tiny_model_dir, groups=1, group_size=3, max_turns=3)  # 1, 2 and 3 turns
    for t in (t for g in groups for t in g):
        t.reward = 1.0
        for u in t.turns[1:]:  # a later turn sees a longer context, as in the env
            u.prompt_ids = u.prompt_ids + u.prompt_ids
            u.logprobs = behaviour_logprobs(model, u.prompt_ids, u.response_ids)
    trainer = Trainer(make_cfg(lr=1e-3, beta=0.0, hrr_weight=0.2, micro_batch_turns=3), tiny_model_dir)
    stats = trainer.train_step(groups)  # 3 first turns (advantage 0), then the 3 later turns
    assert stats["zero_variance_frac"] == 1.0
    assert stats["hrr_abs_mean"] > 0
    assert stats["dlogp_pos_adv"] > 0 > stats["dlogp_neg_adv"]


@pytest.mark.parametrize("micro_batch_turns", [1, 4])
def test_the_update_probe_finds_each_advantage_sign_in_its_own_micro_batch(tiny_model_dir, monkeypatch,
                                                                           micro_batch_turns):
    """One turn per micro-batch: no micro-batch holds both signs, yet both changes are measured (two forwards).
    All four turns in one micro-batch: one forward measures both signs."""
    from ziprl.learner import step

    forwards = []
    monkeypatch.setattr(step, "response_logprobs",
                        lambda m, mb, **kw: forwards.append(mb.input_ids.size(0)) or response_logprobs(m, mb, **kw))
    groups = make_groups(tiny_model_dir, groups=1, group_size=4, max_turns=1)  # rewards 0, 1, 0, 1
    trainer = Trainer(make_cfg(lr=1e-3, beta=0.0, hrr_weight=0.0, micro_batch_turns=micro_batch_turns),
                      tiny_model_dir)
    stats = trainer.train_step(groups)
    pos, neg = stats["dlogp_pos_adv"], stats["dlogp_neg_adv"]
    assert 0.0 not in (pos, neg)
    assert pos > neg  # both measured; the similar responses can rise together
    assert forwards == ([1, 1] if micro_batch_turns == 1 else [4])  # beta = 0: no reference forward


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 + ZeRO-2/3 runs on a CUDA GPU; this machine has none")
@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_zero_on_gpu(stage, tiny_model_dir):
    trainer = Trainer(make_cfg(bf16=True, zero_stage=stage, lr=1e-3, beta=0.001), tiny_model_dir)
    groups = make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=2)
    first, second = trainer.train_step(groups), trainer.train_step(groups)
    assert np.isfinite(first["loss"])
    assert np.isfinite(first["grad_norm"])
    assert second["loss"] < first["loss"]
    weights = trainer.named_weights_numpy()
    assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in weights.values())


def two_rank_worker(model_dir: str, batch_file: str, out_dir: str) -> None:
    """One of two data-parallel ranks (env from the launcher below): a ZeRO-0 and a ZeRO-2 step, results to disk."""
    from safetensors.torch import save_file

    from ziprl.env.group import load_groups
    from ziprl.learner.checkpoint import snapshot
    from ziprl.learner.distributed import rank

    groups = load_groups(batch_file)
    for name, stage, tokens in (("stage0", 0, 0), ("stage2", 2, 0), ("stage2-tokens", 2, 100)):
        cfg = make_cfg(zero_stage=stage, micro_batch_turns=2, lr=1e-2, beta=0.0, max_grad_norm=0.0,
                       micro_batch_tokens=tokens)
        trainer = Trainer(cfg, Path(model_dir))
        seen = capture_grads(trainer)
        stats = trainer.train_step(groups)
        save_file({"grad": seen[-1]}, f"{out_dir}/{name}-rank{rank()}.safetensors")
        snap = snapshot(trainer, f"{out_dir}/{name}-checkpoint", {})  # every rank joins the gathers
        stats["snapshot_numel"] = sum(snap.files[f][k].numel() for f in ("model.safetensors", "optimizer.safetensors")
                                      for k in snap.files[f])
        Path(f"{out_dir}/{name}-rank{rank()}.json").write_text(json.dumps(stats))


def test_two_data_parallel_ranks_take_the_one_rank_step(tiny_model_dir, grad_batches, tmp_path):
    """Two gloo ranks each train on half of the turns (unequal micro-batch counts: 3 and 2 of two turns; 5 and 4
    under a 100-token budget) and reach the gradient, loss and weights of one rank training on all of them. Both
    join a checkpoint's gathers; only rank 0, which writes it, keeps a copy (an 8-rank node held eight before)."""
    from safetensors.torch import load_file

    from ziprl.env.group import save_groups
    from ziprl.learner.distributed import free_port

    batch = grad_batches[0]  # 9 turns: rank 0 gets 5 (3 micro-batches), rank 1 gets 4 (2)
    save_groups(batch, tmp_path / "batch.parquet")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    code = (f"from tests.learner.test_trainer import two_rank_worker; "
            f"two_rank_worker({str(tiny_model_dir)!r}, {str(tmp_path / 'batch.parquet')!r}, {str(tmp_path)!r})")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        errors = [p.communicate(timeout=600)[1] for p in procs]
    finally:
        for p in procs:  # a rank that failed leaves the other waiting in a collective
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), errors[0][-3000:] + errors[1][-3000:]

    cfg = make_cfg(zero_stage=0, micro_batch_turns=2, lr=1e-2, beta=0.0, max_grad_norm=0.0)
    ref_grad, ref_loss = reference_step(tiny_model_dir, Trainer(cfg, tiny_model_dir).named_weights_numpy(), batch, cfg)
    for name in ("stage0", "stage2", "stage2-tokens"):
        grads = [load_file(tmp_path / f"{name}-rank{r}.safetensors")["grad"] for r in range(2)]
        # ZeRO-0: each rank holds the whole averaged gradient; ZeRO-2: each holds its half of the flat one
        grad = grads[0] if name == "stage0" else torch.cat(grads)
        assert grad[: ref_grad.numel()].allclose(ref_grad, rtol=1e-4, atol=1e-6 * float(ref_grad.abs().max()))
        for r in range(2):
            stats = json.loads((tmp_path / f"{name}-rank{r}.json").read_text())
            assert stats["loss"] == pytest.approx(ref_loss, rel=1e-5)
            assert stats["grad_norm"] == pytest.approx(float(ref_grad.norm()), rel=1e-4)
            assert stats["passes"] == (5 if name == "stage2-tokens" else 3)  # the rank with fewer runs fillers
            # a checkpoint's copies (float32 weights and two moments) are held by rank 0 alone, which writes it
            assert stats["snapshot_numel"] == (3 * ref_grad.numel() if r == 0 else 0)


def test_a_zero_gradient_step_skips_the_compute_and_moves_the_weights_as_the_computed_step(tiny_model_dir, monkeypatch):
    """All rewards equal, w = 0, beta = 0: every advantage is 0, so the gradient is exactly zero. The step takes
    the same AdamW update (its moments from the step before still move the weights) without a forward pass."""
    from ziprl.learner import step

    def two_steps(skip: bool):
        trainer = Trainer(make_cfg(beta=0.0, hrr_weight=0.0, lr=1e-3), tiny_model_dir)
        if not skip:
            monkeypatch.setattr(step, "gradient_is_zero", lambda model, rows: False)
        trainer.train_step(make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=1))  # moments != 0
        equal = make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=1, seed=1)
        for t in equal[0]:
            t.reward = 1.0
        calls = []
        monkeypatch.setattr(step, "response_logprobs_and_entropy",
                            lambda *a, **k: calls.append(1) or response_logprobs_and_entropy(*a, **k))
        stats = trainer.train_step(equal)
        monkeypatch.undo()
        return stats, trainer.named_weights_numpy(), calls

    from ziprl.learner.batch import response_logprobs_and_entropy

    skipped, w_skip, calls_skip = two_steps(skip=True)
    computed, w_comp, calls_comp = two_steps(skip=False)
    assert skipped["zero_gradient"] == 1.0
    assert not calls_skip
    assert calls_comp
    assert skipped["grad_norm"] == computed["grad_norm"] == 0.0
    assert skipped["policy_version"] == 2.0
    for name, value in w_comp.items():
        assert np.allclose(w_skip[name], value, atol=1e-7), name


@pytest.mark.parametrize(("setting", "device", "checkpointing", "want"), [
    (None, "cpu", False, True), (None, "cuda", False, False), (True, "cuda", False, True), (False, "cpu", False, False),
    (None, "cpu", True, False), (True, "cuda", True, False)])
def test_the_shared_prefix_runs_by_default_on_a_cpu_only(setting, device, checkpointing, want):
    """null: on a CPU (1.72x there), off on a GPU (1.9-2.2x slower on an H100); never with gradient checkpointing."""
    assert shares_prefix(setting, device, checkpointing) is want
