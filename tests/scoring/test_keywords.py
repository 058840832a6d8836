"""The text helpers behind Q_com: stop words (shipped, no network), keywords, words, sentences and text
statistics."""

from __future__ import annotations

import socket
from pathlib import Path

from ziprl.scoring import extract_keywords
from ziprl.scoring.keywords import NLTK_DATA, sentences, stopwords, text_stats, words


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
    assert "which" not in kw
    assert "about" not in kw  # >= 4 chars, but stop words
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
    assert sentences("") == []
    assert sentences(" . ! ") == []


def test_text_stats():
    s = text_stats("Paris is the capital. It is big. Yes.")
    assert (s.n_words, s.n_sentences, s.n_valid_sentences, s.has_terminator) == (8, 3, 2, True)
    assert text_stats("") == (0, 0, 0, False)
    assert text_stats("one two three") == (3, 1, 1, False)
