"""Policy losses and loss normalisations, registered in :data:`ziprl.registry.LOSSES` and
:data:`ziprl.registry.LOSS_NORMS` (modules of this package) and chosen by ``learner.policy_loss`` and
``learner.loss_norm``.

A policy loss is a function ``(logp, old_logp, adv, weight, mask, ref_logp, beta, clip_eps, tis_cap) -> (loss,
stats)`` over one micro-batch (see :func:`ziprl.learner.losses.ppo_clip.policy_loss`, the ZipRL objective). Its
normalisation is carried by a per-token weight (:func:`token_weight`, from the registered normalisation) computed
once for the whole optimiser batch, so the loss of a micro-batch is a plain weighted *sum* over its tokens.
Summing the micro-batch losses (``loss.backward()`` on each, no division by the number of micro-batches) therefore
reproduces the full-batch objective exactly, however turns are split into micro-batches. Under data parallelism
that *averages* gradients over R ranks, compute the weights over the global batch and scale each rank's loss by R.

The config looks both names up, so a module here imports torch only inside its functions.
"""

from __future__ import annotations

from ziprl.registry import LOSS_NORMS


def token_weight(traj_tokens: int, num_trajectories: int, total_tokens: int, norm: str, budget: int = 0) -> float:
    """Loss weight of one response token of trajectory o_i (``traj_tokens`` = |o_i|) in a batch of
    ``num_trajectories`` trajectories and ``total_tokens`` response tokens; ``budget`` is the most response tokens a
    trajectory may have (``env.max_turns x sampling.max_new_tokens``)."""
    if norm not in LOSS_NORMS:
        raise ValueError(f"loss norm must be one of {', '.join(LOSS_NORMS)}, got {norm!r}")
    return LOSS_NORMS[norm](traj_tokens, num_trajectories, total_tokens, budget)
