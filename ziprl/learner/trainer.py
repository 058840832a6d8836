"""The learner: one DeepSpeed engine for the RL step (GRPO + HRR, paper §3.5) and the SFT cold start.

One code path on every machine: ``deepspeed.initialize`` with ZeRO stage ``learner.zero_stage`` (0-3; gloo on
CPU, nccl on GPU), torch's AdamW, linear warm-up then constant LR, gradient clipping, optional gradient
checkpointing. Precision (``learner.bf16``, by default on where the device multiplies bf16 natively): bf16
compute with float32 master weights and optimizer state either way, through DeepSpeed's bf16 mode on CUDA
with ZeRO >= 1 and through ``torch.autocast`` otherwise (CPUs with AVX-512 BF16 or AMX, CUDA with ZeRO-0).

Rollout correction (``learner.rollout_correction``): when the engine's numerics are not the learner's, the
behaviour log-probs it reports differ from the learner's for the same weights; every step logs that gap per
response token and, with ``tis``, weights each token by min(pi_learner / pi_rollout, C) (``losses.policy_loss``).

Gradient accumulation: a step has as many micro-batches as its turns need, so DeepSpeed runs with
``managed_gradient_accumulation=False``: every ``engine.backward`` only accumulates, and ``engine.step`` is
the one boundary (reduce, clip, update). Each micro-batch loss is a weighted *sum* whose per-token weights
already hold the batch normalisation (``losses.token_weight``), so the losses are summed, never divided by
the number of micro-batches. With R data-parallel ranks every rank is handed the whole batch, computes the
same rows and weights, trains on rows ``rank::R`` (padded to the same number of micro-batches, since ZeRO's
collectives need every rank to run as many passes) and scales its loss by R, because DeepSpeed averages the
gradients over ranks. The leading tokens all of a rank's turns share (the system prompt) run once per step, for the
policy and the reference model (:class:`~ziprl.learner.prefix.StepPrefix`; once per micro-batch under ZeRO-3).

Batch size: :meth:`Trainer.train_step` is ONE optimiser step over the trajectories it is given. The paper's
global batch (64 questions x G trajectories) is what the caller hands it: ``learner.global_batch_questions``
groups of ``rollout.group_size`` trajectories, split into micro-batches of ``learner.micro_batch_turns`` turns (or
up to ``learner.micro_batch_tokens`` padded tokens).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ziprl.config import ConfigError, ZipRLConfig, resolve_engine_dtype
from ziprl.env.trajectory import Trajectory
from ziprl.learner.advantages import compute_advantages
from ziprl.learner.batch import (
    MicroBatch,
    TurnRow,
    build_rows,
    collate,
    computed_tokens,
    micro_batch_bounds,
    plan_micro_batches,
    response_logprobs,
    response_logprobs_and_entropy,
)
from ziprl.learner.distributed import init_distributed, rank, world_size
from ziprl.learner.hardware import (
    GemmPeak,
    ModelSize,
    choose_learner,
    device_clock,
    hardware,
    model_flop_utilisation,
)
from ziprl.learner.prefix import StepPrefix
from ziprl.paths import atomic_dir
from ziprl.policy.kv import shared_prefix_len
from ziprl.policy.models import load_model, load_tokenizer, resolve_device, resolve_model_path, torch_dtype
from ziprl.registry import ENGINES, LOSSES

if TYPE_CHECKING:
    from ziprl.learner.sft import SFTRow


def warmup_factor(warmup_steps: int):
    """LR multiplier for optimiser step s (0-based): linear warm-up over ``warmup_steps`` steps, then 1."""
    return lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def rollout_matches_learner(cfg: ZipRLConfig, bf16: bool) -> bool:
    """True when the generating engine computes exactly the learner's numerics (its spec's ``exact_logprobs``,
    e.g. HF in float32) and the learner runs in float32."""
    return ENGINES[cfg.model.engine].exact_logprobs(resolve_engine_dtype(cfg.model, bf16)) and not bf16


def tis_cap(cfg: ZipRLConfig, bf16: bool) -> float | None:
    """The truncation C of the rollout correction, or None when it is off (``learner.rollout_correction``)."""
    mode = cfg.learner.rollout_correction
    on = mode == "tis" or (mode == "auto" and not rollout_matches_learner(cfg, bf16))
    return cfg.learner.tis_cap if on else None


def shares_prefix(setting: bool | None, device_type: str, checkpointing: bool) -> bool:
    """Whether micro-batches run their shared prefix once (``learner.share_prefix``): null = on a CPU only (on a GPU
    the rows' cached forward needs a masked attention kernel and ran 1.9-2.2x slower on an H100); never with gradient
    checkpointing, under which HF caches nothing."""
    return (device_type == "cpu" if setting is None else setting) and not checkpointing


def enable_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in backward (transformers >= 5 renamed the switch)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def takes_probe(held: tuple[bool, bool] | None, has: bool, both: bool) -> bool:
    """Whether a micro-batch replaces ``held`` (it has the sign's tokens, it has both signs'; None: none yet) as the
    update probe of one advantage sign, micro-batches seen in order: the first with the sign's tokens, and among
    those the first holding both signs (one forward then measures both), else the first micro-batch."""
    return held is None or (has and not held[0]) or (both and not held[1])


def _read(prefix: StepPrefix | None, mb: MicroBatch, last: bool = True) -> Any:
    """The step prefix's KV cache for ``mb``'s rows, or for one row when they share more tokens (the forward runs
    those on from it); None when ``mb`` runs without it (no step prefix, or a filler)."""
    if prefix is None or not mb.prefix_len:
        return None
    return prefix.cache(mb.input_ids.size(0) if mb.prefix_len == prefix.length else 1, last)


def _prefix_len(rows: list[TurnRow], step: int, own: bool) -> int:
    """The leading tokens a micro-batch of ``rows`` runs once: the step's prefix (``step`` long), and with ``own`` the
    longer one its rows share, if they do (0: each micro-batch finds its own shared prefix)."""
    if not own or not step:
        return step
    return max(step, shared_prefix_len([row.input_ids[: row.response_start] for row in rows]))


def _sign_tokens(mb: MicroBatch, sign: str) -> torch.Tensor:
    """The response tokens of ``mb`` whose advantage has ``sign`` ("pos" | "neg")."""
    return mb.loss_mask.bool() & ((mb.adv > 0) if sign == "pos" else (mb.adv < 0))


class Trainer:
    """Policy (a DeepSpeed engine) + frozen reference model (only when beta > 0; a step skips its forward while the
    policy's weights are still the reference's) + optimiser bookkeeping.

    ``model_path`` None trains ``resolve_model_path(cfg.model)``. The reference model is the same checkpoint,
    frozen; build a resumed trainer from the same ``model_path`` so it keeps the same reference.
    """

    def __init__(self, cfg: ZipRLConfig, model_path: str | Path | None = None) -> None:
        cfg.validate()
        self.model_path = Path(model_path) if model_path is not None else resolve_model_path(cfg.model)
        device = resolve_device(cfg.model.device)
        self._ds = init_distributed(cfg.model)
        self.tokenizer = load_tokenizer(self.model_path, cfg.model.trust_remote_code)
        self.pad_id = int(self.tokenizer.pad_token_id)

        model = load_model(self.model_path, "float32", "cpu", cfg.model.trust_remote_code, writable=True)
        # the learner's nulls (bf16, token budget, shared prefix, ZeRO stage) chosen for this hardware and model
        self.choice = choose_learner(hardware(device, world_size(), measure_bf16=cfg.learner.bf16 is None),
                                     ModelSize.of(model), cfg.learner)
        if rank() == 0:
            print(self.choice.summary(), flush=True)
        self.cfg = cfg = dataclasses.replace(cfg, learner=self.choice.learner)
        lc = cfg.learner
        self.bf16 = lc.bf16
        if self.bf16 and device == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            raise ConfigError("learner.bf16: this CPU has no bfloat16 kernels; set learner.bf16=false (float32)")
        ds_bf16 = self.bf16 and device == "cuda" and lc.zero_stage >= 1  # DeepSpeed keeps the float32 master
        self._autocast = self.bf16 and not ds_bf16
        self.tis_cap = tis_cap(cfg, self.bf16)
        self.zero_stage = lc.zero_stage
        if lc.gradient_checkpointing:
            enable_checkpointing(model)
        # fused: one kernel per step on CPU and GPU (the per-tensor loop is ~7x slower on CPU)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lc.lr, weight_decay=lc.weight_decay, fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_factor(lc.warmup_steps))
        # fp32 without ZeRO: DeepSpeed would clip but not report the norm, so we clip in a pre-step hook.
        self._clip_in_hook = lc.zero_stage == 0 and not ds_bf16
        if self._clip_in_hook:
            self.optimizer.register_step_pre_hook(self._clip_hook)
        self._grad_norm = float("nan")
        ds_config = {
            "train_micro_batch_size_per_gpu": lc.micro_batch_turns,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,  # engine.step() is the boundary, however many micro-batches
            "gradient_clipping": 0.0 if self._clip_in_hook else lc.max_grad_norm,
            "zero_optimization": {"stage": lc.zero_stage},
            "bf16": {"enabled": ds_bf16},
            "zero_allow_untested_optimizer": True,  # torch AdamW: runs anywhere, no CUDA op build
            "steps_per_print": 2**31 - 1,
        }
        self.engine, _, _, _ = self._ds.initialize(
            model=model, optimizer=self.optimizer, lr_scheduler=self.scheduler, config=ds_config
        )
        self.engine.train()
        if lc.zero_stage == 0 and world_size() == 1:
            self.engine.enable_backward_allreduce = False  # one rank: averaging would only copy every gradient
        self.device = self.engine.device
        self.share_prefix = shares_prefix(lc.share_prefix, self.device.type, lc.gradient_checkpointing)
        self.num_params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
        self._gemm_peak = GemmPeak(torch.bfloat16 if self.bf16 else torch.float32, self.device.type)
        self._clock = device_clock(self.device)  # the step's parts timed as the device runs them

        self.ref_model = None
        if lc.beta > 0:
            dtype = "bfloat16" if self.bf16 else "float32"
            self.ref_model = load_model(self.model_path, dtype, str(self.device), cfg.model.trust_remote_code)
            self.ref_model.requires_grad_(False)
        self.at_reference = True  # the policy's weights are still the reference's (no update, no checkpoint loaded)
        self.global_step = 0  # optimiser steps taken (RL and SFT)
        self.policy_version = 0  # +1 per optimiser step; tags the weights pushed to the engines

    # ------------------------------------------------------------------ steps

    def train_step(self, trajectories: Sequence[Trajectory], before_compute: Callable[[], None] | None = None
                   ) -> dict[str, float]:
        """One optimiser step of the ZipRL objective over ``trajectories`` (whole groups of G samples).

        Advantages (``learner.advantage_estimator`` per trajectory + HRR per turn) -> turn rows -> micro-batches ->
        the policy loss (``learner.policy_loss``; by default the token-level clipped surrogate with beta * k3 KL to
        the reference) -> one update. Returns the step's statistics; ``kl`` is 0 when beta = 0 (no reference
        model). A batch whose groups were all dropped (zero variance) takes no step; a batch whose every advantage
        is 0 with beta = 0 (zero-variance groups, w = 0) has a zero gradient, so its step runs no forward or
        backward (``zero_gradient`` = 1; on one ZeRO-0 rank, else it is computed). ``before_compute`` runs before every
        forward and every backward (e.g. to take cores that became idle).
        """
        start = self._clock()
        lc = self.cfg.learner
        adv = compute_advantages(trajectories, lc)
        stats = {k: adv.stats[k] for k in ("adv_mean", "adv_std", "hrr_abs_mean", "zero_variance_frac")}
        rows = build_rows(adv.trajectories, adv.turn_advantages, lc.loss_norm,
                          budget=self.cfg.env.max_turns * self.cfg.sampling.max_new_tokens)
        policy_loss = LOSSES[lc.policy_loss]
        if not rows:
            return {**stats, "skipped": 1.0, "seconds": self._clock() - start}
        if self._gradient_is_zero(rows):
            return {**stats, **self._zero_gradient_step(rows), "seconds": self._clock() - start}

        # per token sums: loss, tokens, clipped, kl, entropy, |mismatch|, tis weight; then trained (real) tokens
        # and the tokens the forward ran (a shared prefix once per step, or per micro-batch)
        sums = torch.zeros(9, dtype=torch.float64)
        clock = dict.fromkeys(("forward", "reference", "backward", "optimizer"), 0.0)
        mismatch_max, probes = 0.0, {}
        batches, prefix_ids = self._micro_batches(rows, lc.micro_batch_turns)
        if before_compute is not None and prefix_ids is not None:
            before_compute()
        t0 = self._clock()
        prefix = self._policy_prefix(prefix_ids)
        t1 = self._clock()
        ref_prefix = None
        if prefix_ids is not None and self.ref_model is not None and not self.at_reference:
            with self._compute():
                ref_prefix = StepPrefix(self.ref_model, prefix_ids, grad=False)
        clock["forward"] += t1 - t0
        clock["reference"] += self._clock() - t1
        for i, (mb, real) in enumerate(batches):
            last = i == len(batches) - 1
            if before_compute is not None:
                before_compute()
            t0 = self._clock()
            with self._compute():
                logp, entropy = response_logprobs_and_entropy(self.engine, mb, prefix=_read(prefix, mb, last))
            t1 = self._clock()
            ref_logp = None
            if self.ref_model is not None:
                if self.at_reference:  # the policy is the reference: its log-probs are the reference's (KL 0)
                    ref_logp = logp.detach()
                else:
                    with torch.no_grad(), self._compute():
                        ref_logp = response_logprobs(self.ref_model, mb, prefix=_read(ref_prefix, mb))
            t2 = self._clock()
            # Eq. (ZipRL objective), negated: -sum_t w_t (min(rho A, clip(rho) A) - beta KL_t)
            loss, st = policy_loss(logp, mb.old_logp, mb.adv, mb.weight, mb.loss_mask, ref_logp, lc.beta, lc.clip_eps,
                                   self.tis_cap)
            if before_compute is not None:
                before_compute()
            self._backward(loss, prefix, last)
            t3 = self._clock()
            clock["forward"] += t1 - t0
            clock["reference"] += t2 - t1
            clock["backward"] += t3 - t2
            # every rank probes one micro-batch per sign, so the same count on every rank (ZeRO-3 gathers
            # collectively): see takes_probe
            has = {sign: bool(_sign_tokens(mb, sign).any()) for sign in ("pos", "neg")} if lc.probe_update else {}
            both = all(has.values())
            for sign, held in has.items():
                if takes_probe(probes[sign][2:] if sign in probes else None, held, both):
                    probes[sign] = (mb, logp.detach(), held, both)
            if real:
                n = st["tokens"]
                ent = float((entropy * mb.loss_mask).sum())
                sums += torch.tensor([loss.item(), n, st["clip_frac"] * n, st.get("kl_mean", 0.0) * n, ent,
                                      st["mismatch_abs_mean"] * n, st.get("tis_mean", 1.0) * n,
                                      float(mb.attention_mask.sum()),
                                      float(computed_tokens(mb) - (prefix.length if prefix is not None else 0))])
                mismatch_max = max(mismatch_max, st["mismatch_abs_max"])
        if prefix is not None:
            sums[8] += prefix.length  # the step's prefix ran once
        lr = self.lr
        t0 = self._clock()
        grad_norm = self._optimizer_step()
        clock["optimizer"] = self._clock() - t0
        loss_sum, tokens, clipped, kl, ent, gap, tis, trained, computed = self._all_reduce(sums).tolist()
        seconds = self._clock() - start
        peak = self._gemm_peak()  # after the step, in the step's conditions
        out = {
            **stats,
            "loss": loss_sum,
            "clip_frac": clipped / tokens,
            "kl": kl / tokens,
            "entropy": ent / tokens,
            "grad_norm": grad_norm,
            "lr": lr,
            "tokens": tokens,
            "trained_tokens": trained,
            "computed_tokens": computed,
            "turns": float(len(rows)),
            "passes": float(len(batches)),  # forward/backward passes this rank ran (fillers included)
            "policy_version": float(self.policy_version),
            "mismatch_abs_mean": gap / tokens,
            "mismatch_abs_max": mismatch_max,
            "tis_mean": tis / tokens,
            **{f"{part}_seconds": value for part, value in clock.items()},
            # per rank: each rank runs its share of the tokens on its own device (a shared prefix once)
            "mfu": model_flop_utilisation(self.num_params, computed / world_size(), seconds, peak),
            "gemm_peak_tflops": peak / 1e12,
            "seconds": seconds,
        }
        t0 = self._clock()
        out.update(self._probe_update(probes))
        out["probe_seconds"] = self._clock() - t0  # after the step: not part of "seconds"
        return out

    def _gradient_is_zero(self, rows: list[TurnRow]) -> bool:
        """Every token's objective is rho * 0 and there is no KL term: the gradient is exactly zero (one rank, ZeRO-0,
        where the step can be taken without a backward)."""
        return (self.cfg.learner.beta == 0 and not any(r.advantage for r in rows) and self.zero_stage == 0
                and world_size() == 1)

    def _zero_gradient_step(self, rows: list[TurnRow]) -> dict[str, float]:
        """The step a forward and backward would take when the gradient is exactly zero, without running them: zero
        gradients into the same optimizer step (AdamW's moments still decay and move the weights, as they would)."""
        lr = self.lr
        for p in self.engine.module.parameters():
            p.grad = torch.zeros_like(p)
        t0 = self._clock()
        grad_norm = self._optimizer_step()
        tokens = float(sum(len(r.input_ids) - r.response_start for r in rows))
        return {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "grad_norm": grad_norm, "lr": lr, "tokens": tokens,
                "trained_tokens": 0.0, "computed_tokens": 0.0, "turns": float(len(rows)),
                "policy_version": float(self.policy_version), "optimizer_seconds": self._clock() - t0,
                "zero_gradient": 1.0}

    def _probe_update(self, probes: dict[str, tuple[MicroBatch, torch.Tensor, bool, bool]]) -> dict[str, float]:
        """``dlogp_{sign}_adv``: the mean change of log pi over each probed micro-batch's ``sign`` ("pos" | "neg")
        advantage response tokens after the update (no grad; positive ones should rise, negative ones fall); 0 when
        it has none. One forward per probed micro-batch; under ZeRO-3 one per sign, so every rank gathers alike."""
        out, after = {}, {}
        for sign, (mb, before, *_) in probes.items():
            key = id(mb) if self.zero_stage != 3 else sign
            if key not in after:
                with torch.no_grad(), self._compute():
                    after[key] = response_logprobs(self.engine, mb)
            sel = _sign_tokens(mb, sign)
            out[f"dlogp_{sign}_adv"] = float((after[key] - before)[sel].mean()) if sel.any() else 0.0
        return out

    def _compute(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around a forward when the learner computes in bf16 outside DeepSpeed's bf16 mode."""
        if self._autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sft_step(self, rows: Sequence[SFTRow], micro_batch_size: int | None = None) -> dict[str, float]:
        """One optimiser step of the cold-start SFT loss: NLL of the response tokens, mean over all of them.

        ``rows`` carry ``input_ids`` and ``response_start`` (see ``ziprl.learner.sft.sft_rows``); they are
        split into micro-batches of ``micro_batch_size`` rows (default ``learner.micro_batch_turns``), or by
        ``learner.micro_batch_tokens`` when that is set.
        """
        start = self._clock()
        if not rows:
            raise ValueError("sft_step needs at least one row")
        n = sum(len(r.input_ids) - r.response_start for r in rows)
        # Appendix (Cold Start), L_SFT = -sum_t log pi(o_t | q, o_<t), here averaged over the batch's n response tokens
        turn_rows = [
            TurnRow(input_ids=list(r.input_ids), response_start=r.response_start,
                    old_logp=[0.0] * (len(r.input_ids) - r.response_start), advantage=1.0, weight=1.0 / n, traj_index=i)
            for i, r in enumerate(rows)
        ]
        sums = torch.zeros(2, dtype=torch.float64)  # loss, tokens
        # SFT rows are transitions of different episodes, which share little beyond the system prompt: length order
        batches, prefix_ids = self._micro_batches(turn_rows, micro_batch_size or self.cfg.learner.micro_batch_turns,
                                                  by_prefix=False)
        prefix = self._policy_prefix(prefix_ids)
        for i, (mb, real) in enumerate(batches):
            last = i == len(batches) - 1
            with self._compute():
                logp = response_logprobs(self.engine, mb, prefix=_read(prefix, mb, last))
            loss = -(mb.weight * logp * mb.loss_mask).sum()
            self._backward(loss, prefix, last)
            if real:
                sums += torch.tensor([loss.item(), float(mb.loss_mask.sum())])
        lr = self.lr
        grad_norm = self._optimizer_step()
        loss_sum, tokens = self._all_reduce(sums).tolist()
        return {"loss": loss_sum, "grad_norm": grad_norm, "lr": lr, "tokens": tokens,
                "seconds": self._clock() - start}

    def _policy_prefix(self, prefix_ids: torch.Tensor | None) -> StepPrefix | None:
        """The policy's forward of the step's shared prefix (:meth:`_micro_batches`), None when there is none."""
        if prefix_ids is None:
            return None
        with self._compute():
            return StepPrefix(self.engine, prefix_ids, grad=True)

    def _backward(self, loss: torch.Tensor, prefix: StepPrefix | None, last: bool) -> None:
        """One micro-batch's backward, its loss scaled by the ranks (DeepSpeed averages over them; the weights already
        sum); the step's last one also runs its shared prefix's backward (:class:`StepPrefix`)."""
        self.engine.backward(loss * world_size() + (prefix.carried() if prefix is not None and last else 0.0))
        if prefix is not None and not last:
            prefix.collect()

    def _micro_batches(self, rows: list[TurnRow], size: int, by_prefix: bool = True
                       ) -> tuple[list[tuple[MicroBatch, bool]], torch.Tensor | None]:
        """This rank's micro-batches on the device as (micro-batch, is_real), and the ``[1, S]`` prefix all its rows
        share when it has more than one micro-batch to run it once for (:class:`StepPrefix`; None: each micro-batch
        runs its own shared prefix, if any).

        Rows are sorted by length (similar lengths pad less) and rank r takes rows ``r::R``; the loss is a sum, so
        order is free. When they need more than one micro-batch, on one rank with shared prefixes
        (``learner.share_prefix``) and ``by_prefix``, rows that share leading tokens (a trajectory's turns) go into one
        micro-batch instead (:func:`~ziprl.learner.batch.plan_micro_batches`), which runs the tokens they share beyond
        the step's prefix once (rows that fit one micro-batch stay one pass). On several ranks every micro-batch starts
        from the step's prefix alone: ZeRO-2 and -3 reduce gradients in the order a rank's backward makes them, so
        every rank's passes must run one graph (a two-rank ZeRO-2 step with per-micro-batch prefixes reduced
        mismatched gradients). A rank with fewer micro-batches than another runs zero-weight fillers. Under ZeRO-3 each
        micro-batch runs its own prefix: a step-long prefix graph would hold parameters ZeRO-3 releases after every
        forward.
        """
        r, world = rank(), world_size()
        tokens = self.cfg.learner.micro_batch_tokens
        # every rank plans every rank's share (each holds all rows), so all run the most micro-batches any rank has
        rows = sorted(rows, key=lambda row: len(row.input_ids))
        plans = [micro_batch_bounds([len(row.input_ids) for row in rows[k::world]], size, tokens) for k in range(world)]
        counts, groups = list(map(len, plans)), [rows[r::world][a:b] for a, b in plans[r]]
        own = by_prefix and self.share_prefix and world == 1 and len(groups) > 1
        if own:  # micro-batches of rows that share leading tokens; they run the prefixes their own rows share
            groups = [[rows[i] for i in group] for group in plan_micro_batches(rows, size, tokens)]
            counts = [len(groups)]
        mine = [row for group in groups for row in group]
        step = self.share_prefix and len(groups) > 1 and self.zero_stage != 3
        s = shared_prefix_len([row.input_ids[: row.response_start] for row in mine]) if step else 0
        batches = [(collate(group, self.pad_id, self.share_prefix, _prefix_len(group, s, own) or None), True)
                   for group in groups]
        missing = max(counts) - len(batches)
        if missing:
            filler = collate([dataclasses.replace(rows[0], weight=0.0)], self.pad_id)
            batches += [(filler, False)] * missing
        prefix = torch.tensor([mine[0].input_ids[:s]], device=self.device) if s else None
        return [(mb.to(self.device), real) for mb, real in batches], prefix

    def _optimizer_step(self) -> float:
        """engine.step(): reduce, clip, AdamW update, LR schedule. Returns the pre-clip gradient norm."""
        self.engine.step()
        self.at_reference = False
        self.global_step += 1
        self.policy_version += 1
        norm = self._grad_norm if self._clip_in_hook else self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def _clip_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Clip the (already reduced) gradients right before AdamW updates; remember the norm."""
        grads = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        max_norm = self.cfg.learner.max_grad_norm if self.cfg.learner.max_grad_norm > 0 else float("inf")
        self._grad_norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm))

    def _all_reduce(self, sums: torch.Tensor) -> torch.Tensor:
        if world_size() > 1:
            t = sums.to(self.device)
            torch.distributed.all_reduce(t)
            sums = t.cpu()
        return sums

    @property
    def lr(self) -> float:
        """The learning rate the next optimiser step uses."""
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ weights out

    def gathered(self, modify: bool = False, params: Sequence[torch.nn.Parameter] | None = None
                 ) -> contextlib.AbstractContextManager:
        """Context in which every policy parameter (or just ``params``) is whole on this rank (ZeRO-3 gathers;
        otherwise no-op). With ``modify`` the values rank 0 writes in place are partitioned back on exit.
        """
        if self.zero_stage == 3:
            params = list(self.engine.module.parameters()) if params is None else list(params)
            return self._ds.zero.GatheredParameters(params, modifier_rank=0 if modify else None)
        return contextlib.nullcontext()

    def named_weights(self, device: str = "cpu", dtype: str = "float32") -> dict[str, torch.Tensor]:
        """HF parameter name -> a copy of the policy weights on ``device`` in ``dtype`` (tied weights appear once),
        complete when it returns (a GPU's copies are waited for, so a push is timed as what it costs)."""
        with self.gathered():
            out = {
                name: p.detach().to(device, torch_dtype(dtype), copy=True)
                for name, p in self.engine.module.named_parameters()
            }
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        return out

    def named_weights_numpy(self) -> dict[str, np.ndarray]:
        """:meth:`named_weights` as float32 numpy arrays."""
        return {name: t.numpy() for name, t in self.named_weights().items()}

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the policy as an HF checkpoint (safetensors + config + tokenizer), atomically; returns ``out_dir``.

        Rank 0 writes; the directory appears complete or not at all (written beside it, then renamed).
        """
        out_dir = Path(out_dir)
        with self.gathered():
            copies: dict[tuple, torch.Tensor] = {}  # one copy per tensor: tied weights stay tied, written once
            state = {}
            for k, v in self.engine.module.state_dict().items():
                key = (v.data_ptr(), v.dtype, tuple(v.shape))
                if key not in copies:
                    copies[key] = v.detach().to("cpu", copy=True)
                state[k] = copies[key]
        if rank() == 0:
            with atomic_dir(out_dir) as tmp:
                self.engine.module.save_pretrained(tmp, state_dict=state, safe_serialization=True)
                self.tokenizer.save_pretrained(tmp)
        if world_size() > 1:
            torch.distributed.barrier()
        return out_dir

