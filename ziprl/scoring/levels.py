"""The five compression levels (paper Appendix "Selection of Compression Granularity").

Level g fixes the target character range [L_l^g, L_h^g] of Q_ratio and the word bounds
[W_min^g, W_max^g] and sentence cap S_max^g of Q_level. The paper gives only the character ranges;
the word and sentence bounds are derived from them (see :func:`level_spec`):

    g  name          chars       W_min  W_max  S_max
    1  Ultra-coarse   100-500       14    100      5
    2  Coarse         500-1000      71    200     10
    3  Medium        1000-2000     143    400     20
    4  Fine          2000-3000     286    600     30
    5  Ultra-fine    3000-6000     429   1200     60

    W_min = round(L_l / 7), W_max = round(L_h / 5)
        Characters per word (space included) of English prose vary from 5.4 to 7.1 across HotpotQA
        passages (2nd-98th percentile; mean 6.1). With 7 at the floor and 5 at the ceiling, ordinary
        prose that meets the character range meets the word range too, and Q_level penalises only
        unusual density (runs of tiny tokens, a few very long ones). W_max at level 5 is Q_sem's
        1200-word p_len threshold.
    S_max = ceil(L_h / 100)
        Sentences average 130 characters in HotpotQA passages; 100 is about the 10th percentile of a
        passage's mean sentence length. A text at the top of the range in ordinary sentences stays
        within the cap; one chopped into many short sentences exceeds it.

``level_scale`` multiplies every character range first; the word and sentence bounds are derived
from the scaled ranges, so all bounds scale together. Character bounds round to integers >= 1 and
every count stays >= 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CHARS_PER_WORD_LONG = 7  # W_min: a text at the character floor written in long words
CHARS_PER_WORD_SHORT = 5  # W_max: a text at the character ceiling written in short words
CHARS_PER_SENTENCE = 100  # S_max

# (name, one-line description, chars low, chars high): the paper's list.
_PAPER_LEVELS: dict[int, tuple[str, str, int, int]] = {
    1: ("Ultra-coarse", "retain only the core conclusions", 100, 500),
    2: ("Coarse", "retain the primary questions and key conclusions", 500, 1000),
    3: ("Medium", "retain decision points and important context", 1000, 2000),
    4: ("Fine", "retain the complete logical chain and important details", 2000, 3000),
    5: ("Ultra-fine", "preserve nearly all critical information", 3000, 6000),
}


@dataclass(frozen=True)
class LevelSpec:
    """Targets of one compression level: chars [char_low, char_high], words [words_min, words_max]."""

    level: int
    name: str
    char_low: int
    char_high: int
    words_min: int
    words_max: int
    max_sentences: int

    @property
    def description(self) -> str:
        return _PAPER_LEVELS[self.level][1]


def _round(x: float) -> int:
    """Round half up (``round`` rounds half to even)."""
    return math.floor(x + 0.5)


def level_spec(level: int, scale: float = 1.0) -> LevelSpec:
    """The :class:`LevelSpec` of ``level`` (1..5) with every bound multiplied by ``scale`` (> 0)."""
    if isinstance(level, bool) or not isinstance(level, int) or level not in _PAPER_LEVELS:
        raise ValueError(f"compression level must be an integer in 1..{len(_PAPER_LEVELS)}, got {level!r}")
    if not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"level_scale must be a finite number > 0, got {scale!r}")
    name, _, low, high = _PAPER_LEVELS[level]
    char_low = max(1, _round(low * scale))
    char_high = max(char_low, _round(high * scale))
    words_min = max(1, _round(char_low / CHARS_PER_WORD_LONG))
    words_max = max(words_min, _round(char_high / CHARS_PER_WORD_SHORT))
    max_sentences = max(1, math.ceil(char_high / CHARS_PER_SENTENCE))
    return LevelSpec(level, name, char_low, char_high, words_min, words_max, max_sentences)


LEVELS: dict[int, LevelSpec] = {g: level_spec(g) for g in _PAPER_LEVELS}  # the unscaled table above
