"""Allocation math for the paper's Theorem 1 (relevance-aware vs uniform allocation at the same mean budget).

Pure functions: the budget matching of the two policies and the retained-information measures that
``benchmarks/allocation.py`` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import fmean

from ziprl.scoring.compression import q_info
from ziprl.scoring.keywords import extract_keywords, vocabulary_size
from ziprl.scoring.metrics import normalize_answer


def mean_budget(chars: Sequence[int]) -> float:
    # Theorem 1: the average resource budget alpha_bar = E[f(R)], here mean characters kept per document
    return fmean(chars) if chars else 0.0


def budget_gap(a: float, b: float) -> float:
    """Relative difference |a - b| / b of two mean budgets (0 when both are 0)."""
    return abs(a - b) / b if b else float(a != 0)


def match_budget(mean_chars: Callable[[float], float], target: float, lo: float, hi: float,
                 iters: int = 30) -> tuple[float, float]:
    """The scale t in [lo, hi] whose (non-decreasing) ``mean_chars(t)`` is closest to ``target``, and that mean.

    Bisection; every evaluated point is a candidate, so a step function (sentence-granular notes) still
    gets its closest step. ValueError if ``target`` lies outside [mean_chars(lo), mean_chars(hi)].
    """
    f_lo, f_hi = mean_chars(lo), mean_chars(hi)
    if not f_lo <= target <= f_hi:
        raise ValueError(f"target {target} is outside the reachable budgets [{f_lo}, {f_hi}]; widen [lo, hi]")
    best = min([(abs(f_lo - target), lo, f_lo), (abs(f_hi - target), hi, f_hi)])
    for _ in range(iters):
        mid = (lo + hi) / 2
        f_mid = mean_chars(mid)
        best = min(best, (abs(f_mid - target), mid, f_mid))
        if f_mid < target:
            lo = mid
        else:
            hi = mid
    return best[1], best[2]


def _padded(text: str) -> str:
    return f" {normalize_answer(text)} "


def answer_present(memory: str, answers: Sequence[str]) -> float:
    """1.0 when a gold answer (SQuAD-normalised) occurs in the memory, else 0.0."""
    mem = _padded(memory)
    return float(any(normalize_answer(a) and _padded(a) in mem for a in answers))


def support_recall(memory: str, supporting: Sequence[str]) -> float:
    """Share of the gold supporting sentences kept whole in the memory (compared SQuAD-normalised: case,
    punctuation, articles and spacing ignored, as the teacher's notes drop sentence-final punctuation)."""
    if not supporting:
        return 0.0
    mem = _padded(memory)
    return sum(_padded(s) in mem for s in supporting) / len(supporting)


def memory_q_info(question: str, pool: str, memory: str) -> float:
    # Eq. Q_info with x = the whole retrieved pool and y = the memory kept from it
    return q_info(extract_keywords(question), extract_keywords(pool), extract_keywords(memory),
                  vocabulary_size(memory), vocabulary_size(pool))


def per_kchar(value: float, chars: float) -> float:
    """Retained information per 1,000 characters kept."""
    return 1000.0 * value / chars if chars else 0.0
