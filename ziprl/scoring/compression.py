"""Compression quality Q_com (paper §"Compression Quality Evaluation", Appendix "Details of Compression
Quality Scoring"): x the raw observation, q the question, y the compression, g the chosen level.

Every formula is one pure function. Choices where the paper is silent:

- Keyword sets K(.) come from :func:`~ziprl.scoring.keywords.extract_keywords`; "keywords present in a
  text" means members of that text's keyword set.
- S_key's numerator |K_q ∩ y| counts query keywords present in y AND in x, so it never exceeds its
  denominator |K_q ∩ x| and S_key <= 1: repeating query keywords, or adding ones the source lacks,
  cannot raise it (the paper's anti-gaming bound, Appendix "Robustness ... Against Gaming Behaviors").
- |y| and |x| in S_gen's length term are read as sets, like the |y ∩ K_x| beside them: the number of
  distinct word tokens. With character lengths, repeating words would raise the term (by up to
  0.4 * 0.3 * 0.4 = 0.048 of Q_com) while the text stays in range; with vocabulary sizes repetition
  adds nothing, so repeating query keywords cannot lift a compression's total. An empty x gives 0.
- W_y counts whitespace-separated tokens; S_y counts the pieces between . ! ? terminators followed by
  whitespace (:func:`~ziprl.scoring.keywords.sentences`). Zero sentences do not exceed the sentence
  cap: S_sent = 1 when S_y = 0.
- "No valid sentence structure" in Q_sem: no sentence of at least 3 words; "a single sentence" means
  exactly one such valid sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from ziprl.scoring.keywords import (
    TextStats,
    cached_keywords,
    cached_vocabulary_size,
    extract_keywords,
    text_stats,
    vocabulary_size,
)
from ziprl.scoring.levels import LevelSpec, level_spec

EPS = 1e-8  # the epsilon of S_key and S_gen's denominators
DEFAULT_WEIGHTS = (0.3, 0.1, 0.4, 0.2)  # alpha_1..alpha_4 for Q_ratio, Q_level, Q_info, Q_sem


class Weights(Protocol):
    """Anything with the four Q_com weights, e.g. :class:`ziprl.config.ScoringConfig`."""

    w_ratio: float
    w_level: float
    w_info: float
    w_sem: float


@dataclass(frozen=True)
class CompressionScore:
    """Q_com and its four parts, each in [0, 1] (for non-negative weights summing to 1)."""

    ratio: float
    level: float
    info: float
    sem: float
    total: float


def q_ratio(length: int, low: int, high: int) -> float:
    # Eq. Q_ratio: 1 in [L_l, L_h]; linear below; linear to 0.7 up to 1.5 L_h; 0.3 * 1.5 L_h / l_y beyond
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got low={low}, high={high}")
    if length < low:
        return 0.8 * length / low
    if length <= high:
        return 1.0
    if length <= 1.5 * high:
        return 1.0 - 0.3 * (length - high) / (0.5 * high)
    return 0.3 * 1.5 * high / length


def s_word(n_words: int, words_min: int, words_max: int) -> float:
    # Eq. S_word: 1 in [W_min, W_max]; W_y / W_min below; 0.7 up to 1.5 W_max; 0.3 beyond
    if n_words < words_min:
        return n_words / words_min
    if n_words <= words_max:
        return 1.0
    if n_words <= 1.5 * words_max:
        return 0.7
    return 0.3


def s_sent(n_sentences: int, max_sentences: int) -> float:
    # Eq. S_sent = min(1, max(0.3, S_max / S_y)); S_y = 0 is within the cap
    if n_sentences == 0:
        return 1.0
    return min(1.0, max(0.3, max_sentences / n_sentences))


def q_level(n_words: int, n_sentences: int, spec: LevelSpec) -> float:
    # Eq. Q_level = 0.7 S_word + 0.3 S_sent
    return 0.7 * s_word(n_words, spec.words_min, spec.words_max) + 0.3 * s_sent(n_sentences, spec.max_sentences)


def s_key(k_q: frozenset[str], k_x: frozenset[str], k_y: frozenset[str]) -> float:
    # Eq. S_key = |K_q ∩ y| / (|K_q ∩ x| + eps), the numerator restricted to keywords also in x (so <= 1)
    present = k_q & k_x
    return len(present & k_y) / (len(present) + EPS)


def s_gen(k_x: frozenset[str], k_y: frozenset[str], len_y: int, len_x: int) -> float:
    # Eq. S_gen = 0.6 |y ∩ K_x| / (|K_x| + eps) + 0.4 min(1, 2 |y| / |x|), |.| = distinct tokens
    length_term = min(1.0, 2.0 * len_y / len_x) if len_x else 0.0
    return 0.6 * len(k_x & k_y) / (len(k_x) + EPS) + 0.4 * length_term


def q_info(k_q: frozenset[str], k_x: frozenset[str], k_y: frozenset[str], len_y: int, len_x: int) -> float:
    # Eq. Q_info = 0.7 S_key + 0.3 S_gen; S_gen alone when |K_q ∩ x| = 0
    gen = s_gen(k_x, k_y, len_y, len_x)
    if not k_q & k_x:
        return gen
    return 0.7 * s_key(k_q, k_x, k_y) + 0.3 * gen


def p_str(stats: TextStats, level: int) -> float:
    # Q_sem p_str: 0.3 without a valid sentence, 0.7 for a single sentence unless g = 1, else 1
    if stats.n_valid_sentences == 0:
        return 0.3
    if stats.n_valid_sentences == 1 and level != 1:
        return 0.7
    return 1.0


def p_len(n_words: int) -> float:
    # Q_sem p_len: 0.5 below 20 words, 0.9 above 1200 words, else 1
    if n_words < 20:
        return 0.5
    if n_words > 1200:
        return 0.9
    return 1.0


def p_punc(has_terminator: bool) -> float:
    # Q_sem p_punc: 0.8 without any sentence terminator, else 1
    return 1.0 if has_terminator else 0.8


def q_sem(stats: TextStats, level: int) -> float:
    # Eq. Q_sem = 1.0 * p_str * p_len * p_punc
    return p_str(stats, level) * p_len(stats.n_words) * p_punc(stats.has_terminator)


def q_com(ratio: float, level: float, info: float, sem: float,
          weights: tuple[float, float, float, float] = DEFAULT_WEIGHTS) -> float:
    # Eq. Q_com = a1 Q_ratio + a2 Q_level + a3 Q_info + a4 Q_sem, alpha = {0.3, 0.1, 0.4, 0.2}
    a1, a2, a3, a4 = weights
    return a1 * ratio + a2 * level + a3 * info + a4 * sem


def _weights(weights: Weights | None) -> tuple[float, float, float, float]:
    if weights is None:
        return DEFAULT_WEIGHTS
    w = (weights.w_ratio, weights.w_level, weights.w_info, weights.w_sem)
    if not all(math.isfinite(v) and v >= 0 for v in w):
        raise ValueError(f"Q_com weights must be finite and >= 0, got {w}")
    return w


def compression_quality(question: str, source: str, compressed: str, level: int,
                        level_scale: float = 1.0, weights: Weights | None = None) -> CompressionScore:
    """Score ``compressed`` (y) as a level-``level`` compression of ``source`` (x) for ``question`` (q).

    ``weights`` supplies alpha (only its ``w_*`` fields are read; a ScoringConfig's ``level_scale``
    is not: pass ``level_scale``). None means the paper's {0.3, 0.1, 0.4, 0.2}. Keywords of q and x
    are memoised, so scoring many compressions of one observation costs little more than one.
    """
    spec = level_spec(level, level_scale)
    alpha = _weights(weights)
    stats = text_stats(compressed)
    k_x = cached_keywords(source)
    ratio = q_ratio(len(compressed), spec.char_low, spec.char_high)
    lvl = q_level(stats.n_words, stats.n_sentences, spec)
    info = q_info(cached_keywords(question), k_x, extract_keywords(compressed), vocabulary_size(compressed),
                  cached_vocabulary_size(source))
    sem = q_sem(stats, level)
    return CompressionScore(ratio, lvl, info, sem, q_com(ratio, lvl, info, sem, alpha))
