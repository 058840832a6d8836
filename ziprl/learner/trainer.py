"""The learner: one DeepSpeed engine for the RL step (:func:`~ziprl.learner.step.update_step`: GRPO + HRR, paper
§3.5) and the SFT cold start.

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

Batch size: :meth:`Trainer.train_step` is ONE optimiser step over the groups it is given. The paper's
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
from ziprl.env.group import Group
from ziprl.learner.batch import (
    MicroBatch,
    TurnRow,
    collate,
    micro_batch_bounds,
    plan_micro_batches,
    response_logprobs,
    shareable,
    shared_prompt_len,
)
from ziprl.learner.distributed import init_distributed, rank, world_size
from ziprl.learner.hardware import GemmPeak, ModelSize, choose_learner, device_clock, hardware
from ziprl.learner.packing import packed_length, packing_pays, pair_cost
from ziprl.learner.step import backward_pass, policy_prefix, read_prefix, update_step
from ziprl.learner.step_stats import StepStats, StepSums
from ziprl.paths import atomic_dir
from ziprl.policy.models import load_model, load_tokenizer, resolve_device, resolve_model_path, torch_dtype
from ziprl.registry import ENGINES

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


def micro_batch_prefix_len(rows: list[TurnRow], step: int, share: bool, own: bool) -> int:
    """The leading tokens a micro-batch of ``rows`` runs once: none without ``share``; the step's prefix (``step``
    long) when every micro-batch starts from it alone (not ``own``); else the longest prefix its rows share, at least
    the step's."""
    if not share:
        return 0
    return step if step and not own else max(step, shared_prompt_len(rows))


class Trainer:
    """Policy (a DeepSpeed engine) + frozen ``reference`` model (only when beta > 0; a step skips its forward while the
    policy's weights are still the reference's) + optimiser bookkeeping: the DeepSpeed
    :class:`~ziprl.learner.step.Trainable` that :func:`~ziprl.learner.step.update_step` trains.

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
        # what attention costs a query-key pair, for packing_pays; 0: never pack (packed rows need a 4-D boolean
        # mask, which the sdpa attention takes as is)
        sdpa = model.config._attn_implementation == "sdpa"
        self.pair_cost = pair_cost(model.config) if lc.pack_rows and sdpa else 0.0
        self.share_rows = self.share_prefix  # packed rows run the prompt tokens they share once (a prefix tree)
        self.num_params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
        self._gemm_peak = GemmPeak(torch.bfloat16 if self.bf16 else torch.float32, self.device.type)
        self._clock = device_clock(self.device)  # the step's parts timed as the device runs them

        self.reference = None
        if lc.beta > 0:
            dtype = "bfloat16" if self.bf16 else "float32"
            self.reference = load_model(self.model_path, dtype, str(self.device), cfg.model.trust_remote_code)
            self.reference.requires_grad_(False)
        self.at_reference = True  # the policy's weights are still the reference's (no update, no checkpoint loaded)
        self.global_step = 0  # optimiser steps taken (RL and SFT)
        self.policy_version = 0  # +1 per optimiser step; tags the weights pushed to the engines

    # ------------------------------------------------------------------ steps

    def train_step(self, groups: Sequence[Group], before_compute: Callable[[], None] | None = None
                   ) -> dict[str, float]:
        """One optimiser step of the ZipRL objective over ``groups`` (each the G samples of one question):
        :func:`~ziprl.learner.step.update_step`. Returns the step's statistics (:meth:`StepStats.metrics`); ``kl`` is 0
        when beta = 0 (no reference model), ``zero_gradient`` = 1 when the step ran no forward or backward.
        ``before_compute`` runs before every forward and every backward (e.g. to take cores that became idle).
        """
        stats = StepStats(self._clock, self._gemm_peak, self.num_params)
        update_step(self, groups, stats, before_compute)
        return stats.metrics()

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
        sums = StepSums()
        # SFT rows are transitions of different episodes, which share little beyond the system prompt: length order
        batches, prefix_ids = self.micro_batches(turn_rows, micro_batch_size, by_prefix=False)
        prefix = policy_prefix(self, prefix_ids)
        for i, (mb, real) in enumerate(batches):
            last = i == len(batches) - 1
            with self.compute():
                logp = response_logprobs(self.engine, mb, prefix=read_prefix(prefix, mb, last))
            loss = -(mb.weight * logp * mb.loss_mask).sum()
            backward_pass(self, loss, prefix, last)
            if real:
                sums.loss += loss.item()
                sums.tokens += float(mb.loss_mask.sum())
        lr = self.lr
        grad_norm = self.optimizer_step()
        sums = sums.all_reduce(self.device)
        return {"loss": sums.loss, "grad_norm": grad_norm, "lr": lr, "tokens": sums.tokens,
                "seconds": self._clock() - start}

    # ------------------------------------------------------------------ what update_step trains (step.Trainable)

    @property
    def policy(self) -> Any:
        """What the policy's forwards run through: the DeepSpeed engine (its ``module`` is the HF model)."""
        return self.engine

    def compute(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around a forward when the learner computes in bf16 outside DeepSpeed's bf16 mode."""
        if self._autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def micro_batches(self, rows: list[TurnRow], size: int | None = None, by_prefix: bool = True
                      ) -> tuple[list[tuple[MicroBatch, bool]], torch.Tensor | None]:
        """This rank's micro-batches on the device as (micro-batch, is_real), and the ``[1, S]`` prefix all its rows
        share when it has more than one micro-batch to run it once for (:class:`~ziprl.learner.prefix.StepPrefix`;
        None: each micro-batch runs its own shared prefix, if any).

        Rows are sorted by length (similar lengths pad less) and rank r takes rows ``r::R``, ``size`` rows a
        micro-batch (default ``learner.micro_batch_turns``); the loss is a sum, so order is free. When they need more
        than one micro-batch, on one rank with shared prefixes (``learner.share_prefix``) and ``by_prefix``, rows that
        share leading tokens (a trajectory's turns) go into one micro-batch instead
        (:func:`~ziprl.learner.batch.plan_micro_batches`), which runs the tokens they share beyond the step's prefix
        once (rows that fit one micro-batch stay one pass). On several ranks every micro-batch starts from the step's
        prefix alone: ZeRO-2 and -3 reduce gradients in the order a rank's backward makes them, so every rank's passes
        must run one graph (a two-rank ZeRO-2 step with per-micro-batch prefixes reduced mismatched gradients). A rank
        with fewer micro-batches than another runs zero-weight fillers. Under ZeRO-3 each micro-batch runs its own
        prefix: a step-long prefix graph would hold parameters ZeRO-3 releases after every forward. Each micro-batch's
        prefix length is found once here (:func:`micro_batch_prefix_len`) and handed to ``collate``.
        """
        r, world = rank(), world_size()
        size, tokens = size or self.cfg.learner.micro_batch_turns, self.cfg.learner.micro_batch_tokens
        # every rank plans every rank's share (each holds all rows), so all run the most micro-batches any rank has
        rows = sorted(rows, key=lambda row: len(row.input_ids))
        plans = [micro_batch_bounds([len(row.input_ids) for row in rows[k::world]], size, tokens) for k in range(world)]
        counts, groups = list(map(len, plans)), [rows[r::world][a:b] for a, b in plans[r]]
        own = by_prefix and self.share_prefix and world == 1 and len(groups) > 1
        if own:  # micro-batches of rows that share leading tokens; they run the prefixes their own rows share
            groups = [[rows[i] for i in group] for group in plan_micro_batches(rows, size, tokens)]
            counts = [len(groups)]
        mine = [row for group in groups for row in group]
        s = shared_prompt_len(mine) if self.share_prefix and len(groups) > 1 and self.zero_stage != 3 else 0
        batches = [(self._packed(collate(group, self.pad_id, micro_batch_prefix_len(group, s, self.share_prefix, own))),
                    True) for group in groups]
        missing = max(counts) - len(batches)
        if missing:
            filler = collate([dataclasses.replace(rows[0], weight=0.0)], self.pad_id)
            batches += [(filler, False)] * missing
        prefix = torch.tensor([mine[0].input_ids[:s]], device=self.device) if s else None
        return [(mb.to(self.device), real) for mb, real in batches], prefix

    def _packed(self, mb: MicroBatch) -> MicroBatch:
        """``mb`` to run packed when ``learner.pack_rows`` is on and packing computes less (:func:`packing_pays`),
        its rows sharing the prompt tokens they hold in common with ``learner.share_prefix``."""
        mb = dataclasses.replace(mb, share_rows=self.share_rows)
        pays = self.pair_cost and packing_pays(mb.response_ends, mb.prefix_len, self.pair_cost, packed_length(
            mb.input_ids, mb.response_ends, mb.prefix_len, shareable(mb)))
        return dataclasses.replace(mb, packed=True) if pays else mb

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate ``loss``'s gradient (no reduce, clip or update: :meth:`optimizer_step` is the boundary)."""
        self.engine.backward(loss)

    def optimizer_step(self) -> float:
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
        complete when it returns (a GPU's copies are waited for on this stream, so a push is timed as what it costs, and
        a decode graph captured on the rollout's thread meanwhile is not broken by a device-wide wait)."""
        with self.gathered():
            out = {
                name: p.detach().to(device, torch_dtype(dtype), copy=True)
                for name, p in self.engine.module.named_parameters()
            }
        if torch.device(device).type == "cuda":
            torch.cuda.current_stream(device).synchronize()
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

