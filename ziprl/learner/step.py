"""The paper's update, once (§3.4-3.5): a step's groups -> advantages (GRPO + HRR) -> one row per turn -> the ZipRL
loss per micro-batch -> backward -> one optimizer step.

:func:`update_step` is that step over any :class:`Trainable`: the DeepSpeed :class:`~ziprl.learner.trainer.Trainer`
(ZeRO, data-parallel ranks, bf16, a step's shared prefix run once) and the plain torch of ``examples/one_step.py`` both
run it. What the step measures (timing, MFU, the update probe, the metrics) goes into the
:class:`~ziprl.learner.step_stats.StepStats` it is handed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from ziprl.config import ZipRLConfig
from ziprl.env.group import Group
from ziprl.learner.advantages import compute_advantages
from ziprl.learner.batch import (
    MicroBatch,
    TurnRow,
    build_rows,
    computed_tokens,
    response_logprobs,
    response_logprobs_and_entropy,
)
from ziprl.learner.distributed import world_size
from ziprl.learner.prefix import StepPrefix
from ziprl.learner.step_stats import ADVANTAGE_STATS, StepStats, sign_tokens
from ziprl.registry import LOSSES


class Trainable(Protocol):
    """What :func:`update_step` trains: a policy, its frozen reference, their micro-batches and one optimizer."""

    cfg: ZipRLConfig
    policy: Any  # runs the forwards: an HF causal LM, or a wrapper forwarding to one (a DeepSpeed engine)
    reference: Any | None  # the frozen start, for the KL term (beta > 0); None without one
    at_reference: bool  # the policy's weights are still the reference's, so its log-probs are the reference's
    tis_cap: float | None  # the rollout correction's truncation C; None: off
    zero_stage: int  # DeepSpeed's ZeRO stage (0 for plain torch)
    device: torch.device
    policy_version: int  # +1 per optimizer step

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        ...

    def compute(self) -> contextlib.AbstractContextManager:
        """The context of every forward (e.g. bf16 autocast)."""
        ...

    def micro_batches(self, rows: list[TurnRow]) -> tuple[list[tuple[MicroBatch, bool]], Tensor | None]:
        """The step's micro-batches on the device as (micro-batch, is_real), and the ``[1, S]`` prefix they all share
        to run once (:class:`StepPrefix`; None: none)."""
        ...

    def backward(self, loss: Tensor) -> None:
        """Accumulate ``loss``'s gradient."""
        ...

    def optimizer_step(self) -> float:
        """One update from the accumulated gradient; returns its norm before clipping."""
        ...


def update_step(model: Trainable, groups: Sequence[Group], stats: StepStats,
                before_compute: Callable[[], None] | None = None) -> None:
    """One optimizer step of the ZipRL objective over ``groups`` (each the G samples of one question), measured into
    ``stats``.

    Advantages (``learner.advantage_estimator`` per trajectory + HRR per turn) -> turn rows -> micro-batches -> the
    policy loss (``learner.policy_loss``; by default the token-level clipped surrogate with beta * k3 KL to the
    reference) -> one update. A batch whose groups were all dropped (zero variance) takes no step; a batch whose every
    advantage is 0 with beta = 0 has a zero gradient, so its step runs no forward or backward (:func:`gradient_is_zero`).
    ``before_compute`` runs before every forward and every backward (e.g. to take cores that became idle).
    """
    cfg, lc = model.cfg, model.cfg.learner
    # Eq. (GRPO advantage) per group, then Eq. (advantage_adjust): A_ij = A_i + w (Q_ij - Q_bar_i)
    adv = compute_advantages(groups, lc)
    stats.advantages = {k: adv.stats[k] for k in ADVANTAGE_STATS}
    # Eq. (J_ZipRL)'s 1/G sum_i 1/|o_i| as each response token's weight (learner.loss_norm)
    rows = build_rows(adv.trajectories, adv.turn_advantages, lc.loss_norm,
                      budget=cfg.env.max_turns * cfg.sampling.max_new_tokens)
    stats.turns = len(rows)
    if not rows:
        stats.outcome = "skipped"
    elif gradient_is_zero(model, rows):
        _zero_gradient_step(model, rows, stats)
    else:
        prefix_ids = _accumulate(model, rows, stats, before_compute)
        stats.lr = model.lr
        stats.mark()
        stats.grad_norm = model.optimizer_step()
        stats.lap("optimizer")
        stats.policy_version = model.policy_version
        stats.sums = stats.sums.all_reduce(model.device)
    stats.stop()
    if stats.outcome == "trained":
        stats.mark()
        _measure_probes(model, stats, prefix_ids)
        stats.lap("probe")


def _accumulate(model: Trainable, rows: list[TurnRow], stats: StepStats,
                before_compute: Callable[[], None] | None) -> Tensor | None:
    """Every micro-batch's loss and backward: the step's gradient, accumulated. Returns the step's shared prefix (the
    micro-batches' ``[1, S]`` :class:`StepPrefix` ids; None: none)."""
    lc = model.cfg.learner
    policy_loss = LOSSES[lc.policy_loss]
    batches, prefix_ids = model.micro_batches(rows)
    if before_compute is not None and prefix_ids is not None:
        before_compute()
    stats.mark()
    prefix = policy_prefix(model, prefix_ids)
    stats.lap("forward")
    ref_prefix = None
    if prefix_ids is not None and model.reference is not None and not model.at_reference:
        with model.compute():
            ref_prefix = StepPrefix(model.reference, prefix_ids, grad=False)
    stats.lap("reference")
    for i, (mb, real) in enumerate(batches):
        last = i == len(batches) - 1
        if before_compute is not None:
            before_compute()
        stats.mark()
        with model.compute():
            logp, entropy = response_logprobs_and_entropy(model.policy, mb, prefix=read_prefix(prefix, mb, last))
        stats.lap("forward")
        ref_logp = None
        if model.reference is not None:
            if model.at_reference:  # the policy is the reference: its log-probs are the reference's (KL 0)
                ref_logp = logp.detach()
            else:
                with torch.no_grad(), model.compute():
                    ref_logp = response_logprobs(model.reference, mb, prefix=read_prefix(ref_prefix, mb))
        stats.lap("reference")
        # Eq. (J_ZipRL), negated: -sum_t w_t (min(rho A, clip(rho) A) - beta KL_t)
        loss, st = policy_loss(logp, mb.old_logp, mb.adv, mb.weight, mb.loss_mask, ref_logp, lc.beta, lc.clip_eps,
                               model.tis_cap)
        if before_compute is not None:
            before_compute()
        backward_pass(model, loss, prefix, last)
        stats.lap("backward")
        if lc.probe_update:
            stats.offer_probe(mb, logp)
        if real:
            stats.add(loss.item(), st, float((entropy * mb.loss_mask).sum()), float(mb.attention_mask.sum()),
                      float(computed_tokens(mb) - (prefix.length if prefix is not None else 0)))
    if prefix is not None:
        stats.sums.computed_tokens += prefix.length  # the step's prefix ran once
    stats.passes = len(batches)
    return prefix_ids


def gradient_is_zero(model: Trainable, rows: list[TurnRow]) -> bool:
    """Every token's objective is rho * 0 and there is no KL term: the gradient is exactly zero (on one ZeRO-0 rank,
    where the step can be taken without a backward; ZeRO's collectives need every pass run)."""
    return (model.cfg.learner.beta == 0 and not any(r.advantage for r in rows) and model.zero_stage == 0
            and world_size() == 1)


def _zero_gradient_step(model: Trainable, rows: list[TurnRow], stats: StepStats) -> None:
    """The step a forward and backward would take when the gradient is exactly zero, without running them: zero
    gradients into the same optimizer step (AdamW's moments still decay and move the weights, as they would)."""
    stats.outcome = "zero_gradient"
    stats.lr = model.lr
    for p in getattr(model.policy, "module", model.policy).parameters():
        p.grad = torch.zeros_like(p)
    stats.mark()
    stats.grad_norm = model.optimizer_step()
    stats.lap("optimizer")
    stats.policy_version = model.policy_version
    stats.sums.tokens = float(sum(len(r.input_ids) - r.response_start for r in rows))


def _measure_probes(model: Trainable, stats: StepStats, prefix_ids: Tensor | None) -> None:
    """``stats.dlogp[sign]``: the mean change of log pi over each probed micro-batch's ``sign`` ("pos" | "neg")
    advantage response tokens after the update (no grad; positive ones should rise, negative ones fall); 0 when it
    has none. One forward per probed micro-batch; under ZeRO-3 one per sign, so every rank gathers alike.

    Each probed micro-batch runs as its log-probs before the update ran: on from the step's prefix ``prefix_ids``
    (run again, with the updated weights), not in one forward from position 0, whose bf16 round-off differs by about
    as much as one step changes log pi."""
    after: dict[Any, Tensor] = {}
    prefix = None
    for sign, probe in stats.probes.items():
        key = id(probe.batch) if model.zero_stage != 3 else sign
        if key not in after:
            with torch.no_grad(), model.compute():
                if prefix is None and prefix_ids is not None:
                    prefix = StepPrefix(model.policy, prefix_ids, grad=False)
                after[key] = response_logprobs(model.policy, probe.batch, prefix=read_prefix(prefix, probe.batch))
        sel = sign_tokens(probe.batch, sign)
        stats.dlogp[sign] = float((after[key] - probe.before)[sel].mean()) if sel.any() else 0.0


def policy_prefix(model: Trainable, prefix_ids: Tensor | None) -> StepPrefix | None:
    """The policy's forward of the step's shared prefix, kept for the backward; None when there is none."""
    if prefix_ids is None:
        return None
    with model.compute():
        return StepPrefix(model.policy, prefix_ids, grad=True)


def read_prefix(prefix: StepPrefix | None, mb: MicroBatch, last: bool = True) -> Any:
    """The step prefix's KV cache for ``mb``'s rows, or for one row when they share more tokens (the forward runs
    those on from it) or run packed; None when ``mb`` runs without it (no step prefix, or a filler)."""
    if prefix is None or not mb.prefix_len:
        return None
    return prefix.cache(mb.input_ids.size(0) if mb.prefix_len == prefix.length and not mb.packed else 1, last)


def backward_pass(model: Trainable, loss: Tensor, prefix: StepPrefix | None, last: bool) -> None:
    """One micro-batch's backward, its loss scaled by the data-parallel ranks (DeepSpeed averages over them; the
    weights already sum); the step's last one also runs its shared prefix's backward (:class:`StepPrefix`)."""
    model.backward(loss * world_size() + (prefix.carried() if prefix is not None and last else 0.0))
    if prefix is not None and not last:
        prefix.collect()
