"""Answer metrics (EM, F1) and the text helpers behind Q_com: stop words, keywords, words, sentences."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ziprl.scoring import exact_match, extract_keywords, f1_score, normalize_answer
from ziprl.scoring.keywords import NLTK_DATA, sentences, stopwords, text_stats, words


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


def test_stopwords_come_from_shipped_file_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("stop word loading tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    stopwords.cache_clear()
    words_ = stopwords()
    shipped = Path(NLTK_DATA, "corpora", "stopwords", "english").read_text(encoding="utf-8").split()
    assert words_ == frozenset(shipped)
    assert len(words_) == 179
    assert {"the", "which", "about", "there", "should"} <= words_
    assert (NLTK_DATA / "README.md").is_file()


def test_extract_keywords_removes_stopwords_and_short_tokens():
    kw = extract_keywords("Which theater, about the largest in Paris, opened in 1875?")
    assert kw == {"theater", "largest", "paris", "opened", "1875"}
    assert "which" not in kw and "about" not in kw  # >= 4 chars, but stop words
    assert extract_keywords("The cat sat on a mat.") == frozenset()  # all shorter than 4


def test_extract_keywords_tokenisation():
    # alphanumeric runs: punctuation, hyphens and underscores split; lowercase; non-ASCII letters kept
    assert extract_keywords("Better-known snake_case CAFÉ Ørsted's") == {"better", "known", "snake", "case", "café", "ørsted"}
    assert extract_keywords("") == frozenset()
    assert extract_keywords("well–known “quoted” text") == {"well", "known", "quoted", "text"}


def test_words_and_sentences():
    assert words("  one two\tthree\nfour ") == ["one", "two", "three", "four"]
    assert sentences('Hello world. He said "stop." Then 3.5 kg? Yes! ... end') == [
        "Hello world", 'He said "stop', "Then 3.5 kg", "Yes", "end"]
    assert sentences("no terminator here") == ["no terminator here"]
    assert sentences("") == [] and sentences(" . ! ") == []


def test_text_stats():
    s = text_stats("Paris is the capital. It is big. Yes.")
    assert (s.n_words, s.n_sentences, s.n_valid_sentences, s.has_terminator) == (8, 3, 2, True)
    assert text_stats("") == (0, 0, 0, False)
    assert text_stats("one two three") == (3, 1, 1, False)
