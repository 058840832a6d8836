"""Statistics of the learning benchmark (benchmarks/learning.py): a bootstrap over seeds, questions and samples,
and the issue-47 goals judged on its intervals."""

from __future__ import annotations

import numpy as np

Interval = tuple[float, float, float]  # mean, 95% interval low, high


def bootstrap(after: np.ndarray | list, before: np.ndarray | list | None = None, n: int = 10_000, seed: int = 0,
              chunk: int = 500) -> Interval:
    """Mean of ``after`` (minus ``before``) and its 95% percentile interval, by a hierarchical bootstrap.

    ``after`` and ``before`` are per-sample scores, shape (seeds, questions, samples) or (seeds, questions) for one
    sample each, the same questions in the same order. ``before`` may have one seed row, shared by every seed of
    ``after`` (Stage 1: one model for all seeds), or as many as ``after`` (paired by seed: w = 0.2 against w = 0 of
    the same seed); None estimates the mean of ``after`` itself. The estimate is the mean over seeds and questions
    of the per-question sample mean of ``after`` minus that of ``before``.

    Each of ``n`` replicates resamples with replacement, in this order: the seeds (one draw for both arms, so paired
    seeds stay paired; a single seed is kept as it is), the questions (one draw for every seed and both arms: the
    comparison is paired by question), then the samples of each (seed, question) of each arm independently (the
    samples of a shared ``before`` once per replicate, since they are the same trajectories for every seed).
    Resampling the samples inside resampled questions counts their noise a second time: the interval errs wide.
    """
    after = _per_sample(after)
    before = None if before is None else _per_sample(before)
    n_seeds, n_questions = after.shape[:2]
    if before is not None and (before.shape[1] != n_questions or before.shape[0] not in (1, n_seeds)):
        raise ValueError(f"before {before.shape} does not pair with after {after.shape}")
    rng = np.random.default_rng(seed)
    means = np.concatenate([_replicates(after, before, min(chunk, n - start), rng) for start in range(0, n, chunk)])
    point = after.mean(axis=2).mean() - (0.0 if before is None else before.mean(axis=2).mean())
    return float(point), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _per_sample(scores: np.ndarray | list) -> np.ndarray:
    """``scores`` as a float array (seeds, questions, samples)."""
    a = np.asarray(scores, dtype=float)
    return a[..., None] if a.ndim == 2 else a


def _replicates(after: np.ndarray, before: np.ndarray | None, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` bootstrap means of :func:`bootstrap` (seeds, then questions, then samples resampled)."""
    n_seeds, n_questions = after.shape[:2]
    seeds = rng.integers(0, n_seeds, size=(n, n_seeds)) if n_seeds > 1 else np.zeros((n, 1), dtype=int)
    questions = rng.integers(0, n_questions, size=(n, 1, n_questions))
    out = _arm_means(after, seeds, questions, rng)
    if before is not None:
        out -= _arm_means(before, seeds if len(before) > 1 else np.zeros((n, 1), dtype=int), questions, rng)
    return out


def _arm_means(scores: np.ndarray, seeds: np.ndarray, questions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per replicate: the mean over the drawn seeds and questions of a resample of each one's samples."""
    n, n_samples = len(seeds), scores.shape[2]
    samples = rng.integers(0, n_samples, size=(n, seeds.shape[1], questions.shape[2], n_samples))
    drawn = scores[seeds[:, :, None, None], questions[:, :, :, None], samples]  # (n, seeds, questions, samples)
    return drawn.mean(axis=(1, 2, 3))


def interval_row(name: str, metric: str, est: Interval, **extra: object) -> dict:
    """A results row of one estimate."""
    mean, lo, hi = est
    return {"comparison": name, "metric": metric, "mean": mean, "ci95_low": lo, "ci95_high": hi, **extra}


def goal_rows(gain: dict[str, Interval], seed_gains: list[float], format_errors: Interval,
              hrr_vs_grpo: dict[str, Interval] | None, equal_updates: bool | None) -> list[dict]:
    """Issue 47's goals, each with what was measured and whether it is met (None: not measured).

    ``gain``: HRR (w = 0.2) after RL - Stage 1 per metric (``f1``, ``em``), seeds pooled; ``seed_gains``: each seed's
    F1 gain; ``format_errors``: the same difference of the format-error rate; ``hrr_vs_grpo``: w = 0.2 - w = 0 per
    metric (``q_com``, ``f1``), None when w = 0 was not run (``--quick``); Q_com higher counts from two seeds on (one
    seed's interval holds no seed-to-seed spread); ``equal_updates``: whether both arms took the same number of
    updates (None without w = 0).
    """
    fmt = lambda e: f"{e[0]:+.3f} [{e[1]:+.3f}, {e[2]:+.3f}]"  # noqa: E731
    rows = [
        {"goal": "HRR after RL - Stage 1 >= +0.10 in held-out EM or F1, 95% interval excluding 0 (seeds pooled)",
         "measured": f"F1 {fmt(gain['f1'])}; EM {fmt(gain['em'])}; {len(seed_gains)} seed(s)",
         "met": any(gain[m][0] >= 0.10 and gain[m][1] > 0 for m in ("f1", "em"))},
        {"goal": "each seed's HRR - Stage 1 F1 positive", "measured": ", ".join(f"{g:+.3f}" for g in seed_gains),
         "met": bool(seed_gains) and all(g > 0 for g in seed_gains)},
        {"goal": "format-error rate not up (HRR - Stage 1 interval reaching 0 or below)",
         "measured": fmt(format_errors), "met": format_errors[1] <= 0},
    ]
    if hrr_vs_grpo is None:
        return rows + [{"goal": "HRR vs GRPO: Q_com higher, F1 not lower", "measured": "w = 0 not run (--quick)",
                        "met": None}]
    return rows + [
        {"goal": "HRR - GRPO Q_com higher (interval above 0, >= 2 seeds)",
         "measured": f"{fmt(hrr_vs_grpo['q_com'])}; {len(seed_gains)} seed(s)",
         "met": hrr_vs_grpo["q_com"][1] > 0 and len(seed_gains) >= 2},
        {"goal": "HRR - GRPO F1 not lower (interval reaching 0 or above)", "measured": fmt(hrr_vs_grpo["f1"]),
         "met": hrr_vs_grpo["f1"][2] >= 0},
        {"goal": "HRR and GRPO at equal update counts", "measured": str(equal_updates), "met": equal_updates},
    ]
