"""Answer metrics: answer normalisation, EM and F1 (the text helpers behind Q_com: test_keywords.py)."""

from __future__ import annotations

import pytest

from ziprl.scoring import exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(("text", "expected"), [
    ("The  Quick, Brown fox!", "quick brown fox"),
    ("an apple a day", "apple day"),
    ("Theater and the Anthem", "theater and anthem"),  # articles only as whole words
    ("A.B.C.", "abc"),
    ("  \tNew\nYork  ", "new york"),
    ("the", ""),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_normalises_case_punctuation_articles():
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0


def test_exact_match_takes_max_over_golds():
    assert exact_match("NYC", ["New York City", "nyc"]) == 1.0
    assert exact_match("Boston", ("New York City", "NYC")) == 0.0
    assert exact_match("Boston", []) == 0.0


@pytest.mark.parametrize("pred", ["", "   ", "the", "!!"])
def test_empty_prediction_scores_zero(pred):
    assert exact_match(pred, ["", "the"]) == 0.0
    assert f1_score(pred, ["", "the"]) == 0.0


def test_f1_partial_overlap_by_hand():
    # pred {barack, obama}, gold {obama}: P = 1/2, R = 1, F1 = 2/3
    assert f1_score("Barack Obama", "Obama") == pytest.approx(2 / 3)
    # duplicates count once per gold occurrence: pred [cat, cat] vs [cat]: P = 1/2, R = 1
    assert f1_score("the cat cat", "a cat") == pytest.approx(2 / 3)
    # P = 2/3, R = 2/4 -> F1 = 2 * (2/3)(1/2) / (2/3 + 1/2) = 4/7
    assert f1_score("john smith jr", "John Q. Smith Sr") == pytest.approx(4 / 7)


def test_f1_max_over_golds_and_no_overlap():
    assert f1_score("Barack Obama", ["Michelle", "Barack Obama"]) == 1.0
    assert f1_score("Paris", ["London", "Rome"]) == 0.0
    assert f1_score("Paris", []) == 0.0
