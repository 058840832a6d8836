"""Summary statistics over trajectories: the eval report's and TensorBoard's numbers (pure Python)."""

from __future__ import annotations

from collections import Counter
from statistics import fmean

from ziprl.env.trajectory import Trajectory
from ziprl.registry import TOOLS


def _mean(xs: list[float]) -> float:
    return fmean(xs) if xs else 0.0


def trajectory_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """EM, F1, reward, calls per question of each tool with a ``stats_key``, Q_com parts, token sizes and the level distribution."""
    turns = [t for tr in trajs for t in tr.turns]
    scored = [t for t in turns if t.q_com is not None]
    levels = Counter(t.level for t in turns if t.level is not None and t.action != "invalid")
    n_levels = sum(levels.values())
    out = {
        "trajectories": float(len(trajs)),
        "reward": _mean([tr.reward for tr in trajs]),
        "em": _mean([tr.em for tr in trajs]),
        "f1": _mean([tr.f1 for tr in trajs]),
        "finish_rate": _mean([float(tr.finished) for tr in trajs]),
        "turns": _mean([float(len(tr.turns)) for tr in trajs]),
        **{TOOLS[name].stats_key: _mean([float(sum(t.action == name for t in tr.turns)) for tr in trajs])
           for name in TOOLS if TOOLS[name].stats_key},
        "format_error_rate": _mean([float(t.format_error is not None) for t in turns]),
        "prompt_tokens_per_turn": _mean([float(t.prompt_tokens) for t in turns]),
        "response_tokens_per_turn": _mean([float(t.response_tokens) for t in turns]),
        "tokens_per_trajectory": _mean([float(sum(t.prompt_tokens + t.response_tokens for t in tr.turns)) for tr in trajs]),
        "q_com": _mean([t.q_com for t in scored]),
        "q_ratio": _mean([t.q_ratio for t in scored]),
        "q_level": _mean([t.q_level for t in scored]),
        "q_info": _mean([t.q_info for t in scored]),
        "q_sem": _mean([t.q_sem for t in scored]),
        "scored_turn_fraction": len(scored) / len(turns) if turns else 0.0,
    }
    for g in range(1, 6):
        out[f"level_{g}_frac"] = levels[g] / n_levels if n_levels else 0.0
    return out
