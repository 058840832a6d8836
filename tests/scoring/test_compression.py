"""Compression levels and every branch of the Q_com formulas (paper Appendix "Details of Compression
Quality Scoring"), with hand-computed values."""

from __future__ import annotations

import pytest

from ziprl.config import ScoringConfig
from ziprl.scoring import LEVELS, CompressionScore, LevelSpec, compression_quality, level_spec
from ziprl.scoring.compression import (
    EPS,
    p_len,
    p_punc,
    p_str,
    q_com,
    q_info,
    q_level,
    q_ratio,
    q_sem,
    s_gen,
    s_key,
    s_sent,
    s_word,
)
from ziprl.scoring.keywords import TextStats, cached_keywords, text_stats

# ---------------------------------------------------------------- levels


def test_level_table_at_scale_one():
    got = {g: (s.name, s.char_low, s.char_high, s.words_min, s.words_max, s.max_sentences) for g, s in LEVELS.items()}
    assert got == {
        1: ("Ultra-coarse", 100, 500, 14, 100, 5),
        2: ("Coarse", 500, 1000, 71, 200, 10),
        3: ("Medium", 1000, 2000, 143, 400, 20),
        4: ("Fine", 2000, 3000, 286, 600, 30),
        5: ("Ultra-fine", 3000, 6000, 429, 1200, 60),
    }
    assert all(level_spec(g) == LEVELS[g] for g in LEVELS)
    assert LEVELS[1].description == "retain only the core conclusions"


def test_level_scale_scales_every_bound():
    # W_min = round(L_l / 7), W_max = round(L_h / 5), S_max = ceil(L_h / 100), on the scaled ranges
    assert level_spec(3, 0.1) == LevelSpec(3, "Medium", 100, 200, 14, 40, 2)
    assert level_spec(1, 2.0) == LevelSpec(1, "Ultra-coarse", 200, 1000, 29, 200, 10)  # 28.6 -> 29
    assert level_spec(2, 0.25) == LevelSpec(2, "Coarse", 125, 250, 18, 50, 3)  # 17.9 -> 18, 2.5 -> 3
    assert level_spec(1, 0.125) == LevelSpec(1, "Ultra-coarse", 13, 63, 2, 13, 1)  # 12.5 -> 13, 62.5 -> 63


def test_tiny_scale_keeps_counts_at_least_one():
    for g in LEVELS:
        s = level_spec(g, 1e-4)
        assert 1 <= s.char_low <= s.char_high
        assert 1 <= s.words_min <= s.words_max
        assert s.max_sentences >= 1


@pytest.mark.parametrize("level", [0, 6, -1, 2.5, "3", True, None])
def test_bad_level_names_valid_range(level):
    with pytest.raises(ValueError, match=r"1\.\.5"):
        level_spec(level)


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), float("inf"), "1"])
def test_bad_scale(scale):
    with pytest.raises(ValueError, match="level_scale must be a finite number > 0"):
        level_spec(1, scale)


# ---------------------------------------------------------------- Q_ratio (L_l = 100, L_h = 500)


@pytest.mark.parametrize(("length", "expected"), [
    (0, 0.0),  # below: 0.8 * l / L_l
    (50, 0.4),
    (99, 0.792),
    (100, 1.0),  # inside [L_l, L_h], both ends included
    (300, 1.0),
    (500, 1.0),
    (600, 0.88),  # 1 - 0.3 * 100 / 250
    (750, 0.7),  # l = 1.5 L_h still the linear branch
    (751, 0.3 * 750 / 751),  # beyond: 0.3 * 1.5 L_h / l
    (1500, 0.15),
])
def test_q_ratio_branches(length, expected):
    assert q_ratio(length, 100, 500) == pytest.approx(expected)


def test_q_ratio_rejects_bad_bounds():
    with pytest.raises(ValueError):
        q_ratio(10, 0, 500)
    with pytest.raises(ValueError):
        q_ratio(10, 600, 500)


# ---------------------------------------------------------------- Q_level (W in [17, 83], S_max = 4)
# (bounds chosen to exercise the branches; the level table is tested above)


@pytest.mark.parametrize(("n_words", "expected"), [
    (0, 0.0), (10, 10 / 17), (16, 16 / 17),  # below: W_y / W_min
    (17, 1.0), (50, 1.0), (83, 1.0),  # inside
    (84, 0.7), (124, 0.7),  # up to 1.5 W_max = 124.5
    (125, 0.3), (10_000, 0.3),  # beyond
])
def test_s_word_branches(n_words, expected):
    assert s_word(n_words, 17, 83) == pytest.approx(expected)


@pytest.mark.parametrize(("n_sentences", "expected"), [
    (0, 1.0),  # zero sentences do not exceed the cap
    (1, 1.0), (4, 1.0),  # S_max / S_y >= 1 clamps to 1
    (8, 0.5), (13, 4 / 13),
    (14, 0.3), (100, 0.3),  # S_max / S_y < 0.3 clamps to 0.3
])
def test_s_sent_clamps(n_sentences, expected):
    assert s_sent(n_sentences, 4) == pytest.approx(expected)


def test_q_level_weights():
    spec = LEVELS[1]  # W in [14, 100], S_max = 5
    assert q_level(50, 10, spec) == pytest.approx(0.7 * 1.0 + 0.3 * 0.5)
    assert q_level(120, 2, spec) == pytest.approx(0.7 * 0.7 + 0.3 * 1.0)
    assert q_level(7, 20, spec) == pytest.approx(0.7 * 0.5 + 0.3 * 0.3)
    assert q_level(0, 0, spec) == pytest.approx(0.3)


# ---------------------------------------------------------------- Q_info

KQ = frozenset({"born", "composer", "ludwig", "vienna"})
KX = frozenset({"born", "composer", "ludwig", "bonn", "1770", "german"})


def test_s_key_counts_query_keywords_in_y_and_x():
    # K_q ∩ x = {born, composer, ludwig}; y has born, composer and vienna (not in x: not counted)
    ky = frozenset({"born", "composer", "vienna", "bonn"})
    assert s_key(KQ, KX, ky) == pytest.approx(2 / 3)
    assert s_key(KQ, KX, KQ | KX) == pytest.approx(1.0)
    assert s_key(KQ, KX, KQ | KX) < 1.0  # 3 / (3 + eps): never above 1
    assert s_key(KQ, frozenset(), KQ) == 0.0  # nothing to retain: 0 / eps


def test_epsilon():
    assert EPS == 1e-8
    assert s_key(KQ, KX, KX) == 3 / (3 + 1e-8)
    assert s_gen(KX, KX, 0, 100) == 0.6 * 6 / (6 + 1e-8)


def test_s_gen_by_hand():
    ky = frozenset({"born", "bonn", "vienna"})  # 2 of the 6 source keywords
    assert s_gen(KX, ky, 100, 1000) == pytest.approx(0.6 * 2 / 6 + 0.4 * 0.2)
    assert s_gen(KX, ky, 600, 1000) == pytest.approx(0.6 * 2 / 6 + 0.4 * 1.0)  # min(1, 1.2)
    assert s_gen(frozenset(), ky, 100, 0) == 0.0  # empty x: ratio term 0, no division error


def test_q_info_combines_and_falls_back():
    ky = frozenset({"born", "composer", "bonn"})
    expected = 0.7 * 2 / 3 + 0.3 * (0.6 * 3 / 6 + 0.4 * 0.5)
    assert q_info(KQ, KX, ky, 250, 1000) == pytest.approx(expected)
    # no query keyword in x: S_gen alone, even though y carries query keywords
    kq = frozenset({"vienna", "symphony"})
    assert q_info(kq, KX, ky | kq, 250, 1000) == s_gen(KX, ky | kq, 250, 1000)


# ---------------------------------------------------------------- Q_sem

ONE_SENTENCE = "Beethoven was born in Bonn."
TWO_SENTENCES = "Beethoven was born in Bonn. He moved to Vienna later."
FRAGMENTS = "Bonn. Vienna! Yes?"


@pytest.mark.parametrize(("text", "level", "expected"), [
    (ONE_SENTENCE, 3, 0.7),  # a single sentence
    (ONE_SENTENCE, 1, 1.0),  # ... is fine at level 1
    (TWO_SENTENCES, 3, 1.0),
    (FRAGMENTS, 3, 0.3),  # no sentence of >= 3 words: no valid structure
    (FRAGMENTS, 1, 0.3),  # the level-1 exemption does not cover it
    ("Bonn. " + ONE_SENTENCE, 2, 0.7),  # one valid sentence plus a fragment is still one sentence
    ("", 3, 0.3),
])
def test_p_str(text, level, expected):
    assert p_str(text_stats(text), level) == expected


@pytest.mark.parametrize(("n_words", "expected"), [(0, 0.5), (19, 0.5), (20, 1.0), (1200, 1.0), (1201, 0.9)])
def test_p_len(n_words, expected):
    assert p_len(n_words) == expected


def test_p_punc():
    assert p_punc(True) == 1.0
    assert p_punc(False) == 0.8


def test_q_sem_multiplies_penalties():
    # one sentence at level 2 (0.7), 10 words (0.5), no terminator (0.8)
    assert q_sem(text_stats("Beethoven was born in Bonn and moved to Vienna later"), 2) == pytest.approx(0.28)
    assert q_sem(TextStats(25, 3, 3, True), 3) == 1.0
    assert q_sem(TextStats(1300, 40, 40, True), 5) == pytest.approx(0.9)


# ---------------------------------------------------------------- Q_com


def test_q_com_default_and_custom_weights():
    assert q_com(1, 1, 1, 1) == pytest.approx(1.0)
    assert q_com(1, 0, 0, 0) == pytest.approx(0.3)
    assert q_com(0, 1, 0, 0) == pytest.approx(0.1)
    assert q_com(0, 0, 1, 0) == pytest.approx(0.4)
    assert q_com(0, 0, 0, 1) == pytest.approx(0.2)
    assert q_com(0.5, 0.5, 0.5, 0.5, (0.25, 0.25, 0.25, 0.25)) == pytest.approx(0.5)


SOURCE = "Ludwig van Beethoven was a German composer. He was born in Bonn in 1770. He died in Vienna."
QUESTION = "Where was the composer Ludwig van Beethoven born?"
COMPRESSED = "Beethoven, the composer, was born in Bonn."


def test_compression_quality_end_to_end_by_hand():
    # level 1 at scale 0.1: chars [10, 50], words [1, 10], S_max 1
    assert (len(COMPRESSED), len(SOURCE)) == (42, 91)
    score = compression_quality(QUESTION, SOURCE, COMPRESSED, 1, level_scale=0.1)
    assert isinstance(score, CompressionScore)
    assert score.ratio == 1.0  # 42 chars in [10, 50]
    assert score.level == pytest.approx(1.0)  # 7 words in [1, 10], 1 sentence <= 1
    # K_q ∩ x = {ludwig, beethoven, composer, born}, y keeps 3; y keeps 4 of 9 source keywords;
    # distinct tokens: y has 7 (beethoven the composer was born in bonn), x has 14 -> min(1, 2 * 7 / 14) = 1
    info = 0.7 * 3 / 4 + 0.3 * (0.6 * 4 / 9 + 0.4 * min(1.0, 2 * 7 / 14))
    assert score.info == pytest.approx(info)
    assert score.sem == pytest.approx(0.5)  # one sentence at level 1: ok; 7 words < 20: 0.5
    assert score.total == pytest.approx(0.3 + 0.1 + 0.4 * info + 0.2 * 0.5)


def test_weights_from_scoring_config():
    w = ScoringConfig(w_ratio=1.0, w_level=0.0, w_info=0.0, w_sem=0.0, level_scale=123.0)
    score = compression_quality(QUESTION, SOURCE, COMPRESSED, 1, level_scale=0.1, weights=w)
    assert score.total == score.ratio == 1.0  # the config's level_scale is not read
    default = compression_quality(QUESTION, SOURCE, COMPRESSED, 1, level_scale=0.1)
    assert compression_quality(QUESTION, SOURCE, COMPRESSED, 1, 0.1, ScoringConfig()) == default
    with pytest.raises(ValueError, match="weights"):
        compression_quality(QUESTION, SOURCE, COMPRESSED, 1, weights=ScoringConfig(w_sem=-0.1))


def test_empty_compression_is_well_defined():
    s = compression_quality(QUESTION, SOURCE, "", 3)
    assert s.ratio == 0.0
    assert s.level == pytest.approx(0.3)  # S_word 0, S_sent 1 (no sentences)
    assert s.info == 0.0
    assert s.sem == pytest.approx(0.3 * 0.5 * 0.8)
    assert s.total == pytest.approx(0.1 * 0.3 + 0.2 * 0.12)


def test_empty_source_and_question():
    s = compression_quality("", "", COMPRESSED, 1, level_scale=0.1)
    assert s.info == pytest.approx(0.0)  # K_x empty and |x| = 0: S_gen = 0, no division error
    assert compression_quality("", "", "", 5).total >= 0.0


def test_source_keywords_are_cached():
    cached_keywords.cache_clear()
    for y in ("Beethoven was born in Bonn.", "Bonn.", "Born in Bonn in 1770."):
        compression_quality(QUESTION, SOURCE, y, 1)
    info = cached_keywords.cache_info()
    assert (info.misses, info.hits) == (2, 4)  # q and x extracted once each


def test_repeating_words_does_not_grow_the_length_term():
    base = compression_quality(QUESTION, SOURCE, COMPRESSED, 1, level_scale=0.1)
    padded = compression_quality(QUESTION, SOURCE, COMPRESSED[:-1] + " composer born Beethoven.", 1, level_scale=0.1)
    assert padded.info == pytest.approx(base.info)
    assert padded.total <= base.total
