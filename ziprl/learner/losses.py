"""Token-level losses: clipped surrogate, k3 KL to the reference, and the ZipRL objective (paper §3.5).

Normalisation is carried by a per-token weight (see ``token_weight``) computed once for the whole
optimiser batch, so the loss of a micro-batch is a plain weighted *sum* over its tokens. Summing the
micro-batch losses (``loss.backward()`` on each, no division by the number of micro-batches) therefore
reproduces the full-batch objective exactly, however turns are split into micro-batches. Under data
parallelism that *averages* gradients over R ranks, compute the weights over the global batch and scale
each rank's loss by R.
"""

from __future__ import annotations

import torch
from torch import Tensor

NORMS = ("trajectory", "token")


def token_weight(traj_tokens: int, num_trajectories: int, total_tokens: int, norm: str) -> float:
    """Loss weight of one response token of trajectory o_i in a batch of ``num_trajectories`` trajectories."""
    if norm == "trajectory":
        # Eq. (ZipRL objective): 1/G sum_i 1/|o_i| sum_j sum_t  ->  weight 1 / (G * |o_i|), |o_i| over all turns
        return 1.0 / (num_trajectories * traj_tokens)
    if norm == "token":
        # token-mean (DAPO): every response token in the batch weighs 1 / N_tokens
        return 1.0 / total_tokens
    raise ValueError(f"loss norm must be one of {NORMS}, got {norm!r}")


def token_logprobs(logits: Tensor, targets: Tensor, chunk_rows: int = 1024) -> Tensor:
    """log softmax(logits)[target] in float32, as logit[target] - logsumexp(logits), ``chunk_rows`` rows at a time.

    Never materialises the full log-softmax; peak temporaries are one float32 chunk of [chunk_rows, V].
    """
    flat, tgt = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    out = []
    for s in range(0, flat.size(0), chunk_rows):
        z = flat[s : s + chunk_rows].float()
        out.append(z.gather(-1, tgt[s : s + chunk_rows, None]).squeeze(-1) - torch.logsumexp(z, dim=-1))
    return (
        torch.cat(out).reshape(targets.shape) if out else flat.new_zeros(targets.shape, dtype=torch.float32)
    )


@torch.no_grad()
def entropy_from_logits(logits: Tensor, chunk_rows: int = 1024) -> Tensor:
    """Per-position entropy H = logsumexp(z) - sum softmax(z) z (float32, chunked, no grad; for logging)."""
    flat = logits.reshape(-1, logits.size(-1))
    out = []
    for s in range(0, flat.size(0), chunk_rows):
        z = flat[s : s + chunk_rows].float()
        out.append(torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1))
    return torch.cat(out).reshape(logits.shape[:-1]) if out else flat.new_zeros(logits.shape[:-1])


def clipped_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, eps: float) -> Tensor:
    """Per-token m_t of the ZipRL objective (to be maximised)."""
    ratio = torch.exp(logp - old_logp)  # Eq. (ZipRL objective): rho_t = pi_theta / pi_theta_old
    # Eq. (ZipRL objective): m_t = min(rho_t A, clip(rho_t, 1 - eps, 1 + eps) A)
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)


def truncated_is_weight(learner_logp: Tensor, rollout_logp: Tensor, cap: float) -> Tensor:
    """Per-token rollout-correction weight, no grad: the learner's probability over the engine's, truncated at ``cap``."""
    # Eq. (TIS, verl's rollout correction): w_t = min(pi_learner(o_t) / pi_rollout(o_t), C)
    return torch.exp(learner_logp.detach() - rollout_logp).clamp(max=cap)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL[pi_theta || pi_ref] estimate, unbiased and >= 0 (Schulman's k3)."""
    d = ref_logp - logp
    # k3: KL ~ exp(ref - logp) - (ref - logp) - 1
    return torch.exp(d) - d - 1.0


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    weight: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    clip_eps: float = 0.2,
    tis_cap: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Negated ZipRL objective of one micro-batch: -sum_t weight_t (m_t - beta KL_t) over response tokens.

    All inputs are [B, T] and aligned; ``mask`` is 1 on response tokens only, ``weight`` comes from
    ``token_weight`` (it holds the 1/(G|o_i|) or 1/N normalisation). A ``ref_logp`` with ``beta = 0`` is
    used for the KL statistic only. Stats are token means over this micro-batch plus its token count, and
    ``mismatch_abs_mean``/``_max``: |log pi_learner - log pi_rollout| per response token.

    ``old_logp`` are the rollout engine's (behaviour) log-probs. With ``tis_cap`` set (rollout correction), the
    ratio is taken against the learner's own log-probs of these weights (``logp`` detached: the proximal policy
    of decoupled PPO, which is verl's recomputed old log-prob when on-policy) and every token's term is weighted
    by ``truncated_is_weight``, so the engine's numerics (bf16, int8, other kernels) no longer bias the ratio.
    """
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (reference-model log-probs)")
    m = mask.bool()
    if tis_cap is None:
        objective = clipped_surrogate(logp, old_logp, adv, clip_eps)
    else:
        tis = truncated_is_weight(logp, old_logp, tis_cap)
        objective = tis * clipped_surrogate(logp, logp.detach(), adv, clip_eps)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else None
    if kl is not None and beta > 0:
        objective = objective - beta * kl  # Eq. (ZipRL objective): m_t - beta * D_KL[pi_theta || pi_ref]
    loss = -torch.where(m, weight * objective, torch.zeros_like(objective)).sum()

    with torch.no_grad():
        n = m.sum().clamp(min=1)
        ratio = torch.exp(logp - old_logp) if tis_cap is None else torch.ones_like(logp)
        clipped = ((adv > 0) & (ratio > 1 + clip_eps)) | ((adv < 0) & (ratio < 1 - clip_eps))
        gap = (logp - old_logp).abs()
        stats = {
            "tokens": float(m.sum()),
            "mismatch_abs_mean": float(gap[m].sum() / n),
            "mismatch_abs_max": float(gap[m].max()) if m.any() else 0.0,
            "clip_frac": float((clipped & m).sum() / n),
            "ratio_mean": float(ratio[m].sum() / n),
            "ratio_max": float(ratio[m].max()) if m.any() else 0.0,
            "adv_token_mean": float(adv[m].sum() / n),
        }
        if tis_cap is not None:
            stats["tis_mean"] = float(tis[m].sum() / n)
            stats["tis_capped_frac"] = float(((tis >= tis_cap) & m).sum() / n)
        if kl is not None:
            stats["kl_mean"] = float(kl[m].sum() / n)
    return loss, stats
