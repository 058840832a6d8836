"""Loss normalisations (``learner.loss_norm``): the weight of one response token of trajectory o_i, from |o_i|,
the batch's G trajectories and N response tokens, and the generation budget L of one trajectory."""

from __future__ import annotations

from ziprl.registry import LOSS_NORMS


@LOSS_NORMS.register("trajectory", order=0)
def trajectory_norm(traj_tokens: int, num_trajectories: int, total_tokens: int, budget: int) -> float:
    """The paper's: each trajectory's tokens average to 1/G of the loss."""
    # Eq. (ZipRL objective): 1/G sum_i 1/|o_i| sum_j sum_t  ->  weight 1 / (G * |o_i|), |o_i| over all turns
    return 1.0 / (num_trajectories * traj_tokens)


@LOSS_NORMS.register("token", order=1)
def token_norm(traj_tokens: int, num_trajectories: int, total_tokens: int, budget: int) -> float:
    """DAPO's token mean: every response token of the batch weighs the same."""
    # token-mean (DAPO): every response token in the batch weighs 1 / N_tokens
    return 1.0 / total_tokens


@LOSS_NORMS.register("constant", order=2)
def constant_norm(traj_tokens: int, num_trajectories: int, total_tokens: int, budget: int) -> float:
    """Dr. GRPO's: no length normalisation, a constant in its place (a long trajectory weighs more)."""
    if budget < 1:
        raise ValueError(f"the constant loss norm needs the generation budget (>= 1 token), got {budget}")
    # Eq. (Dr. GRPO objective): 1/G sum_i sum_t / L  ->  weight 1 / (G * L), L = the generation budget
    return 1.0 / (num_trajectories * budget)
