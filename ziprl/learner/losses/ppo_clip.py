"""``ppo_clip``: the ZipRL objective (paper §3.5, Eq. J_ZipRL): the token-level clipped surrogate minus beta times
the k3 KL to the reference, with truncated importance sampling as the rollout correction (``learner.tis_cap``).

torch is imported inside the functions: the config looks policy losses up by name, so this module must stay cheap
to import (as the engines' registration modules do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ziprl.registry import LOSSES

if TYPE_CHECKING:
    from torch import Tensor


def clipped_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, eps: float) -> Tensor:
    """Per-token m_t of the ZipRL objective (to be maximised)."""
    import torch

    ratio = torch.exp(logp - old_logp)  # Eq. (ZipRL objective): rho_t = pi_theta / pi_theta_old
    # Eq. (ZipRL objective): m_t = min(rho_t A, clip(rho_t, 1 - eps, 1 + eps) A)
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)


def truncated_is_weight(learner_logp: Tensor, rollout_logp: Tensor, cap: float) -> Tensor:
    """Per-token rollout-correction weight, no grad: the learner's probability over the engine's, truncated at ``cap``."""
    import torch

    # Eq. (TIS, verl's rollout correction): w_t = min(pi_learner(o_t) / pi_rollout(o_t), C)
    return torch.exp(learner_logp.detach() - rollout_logp).clamp(max=cap)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL[pi_theta || pi_ref] estimate, unbiased and >= 0 (Schulman's k3)."""
    import torch

    d = ref_logp - logp
    # k3: KL ~ exp(ref - logp) - (ref - logp) - 1
    return torch.exp(d) - d - 1.0


@LOSSES.register("ppo_clip", order=0)
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
    ``token_weight`` (it holds the normalisation ``learner.loss_norm`` names, e.g. the paper's 1/(G|o_i|)). A ``ref_logp`` with ``beta = 0`` is
    used for the KL statistic only. Stats are token means over this micro-batch plus its token count, and
    ``mismatch_abs_mean``/``_max``: |log pi_learner - log pi_rollout| per response token.

    ``old_logp`` are the rollout engine's (behaviour) log-probs. With ``tis_cap`` set (rollout correction), the
    ratio is taken against the learner's own log-probs of these weights (``logp`` detached: the proximal policy
    of decoupled PPO, which is verl's recomputed old log-prob when on-policy) and every token's term is weighted
    by ``truncated_is_weight``, so the engine's numerics (bf16, int8, other kernels) no longer bias the ratio.
    """
    import torch

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
