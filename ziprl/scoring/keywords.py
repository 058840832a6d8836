"""Keyword extraction for Q_info and the word/sentence counts used by Q_level and Q_sem.

Keywords (paper §Compression Quality Evaluation): lowercase alphanumeric tokens of at least 4
characters that are not English stop words. The stop word list is NLTK's, read from the copy shipped
in ``ziprl/data/nltk`` (never ``nltk.download``); tokenisation needs no data.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

NLTK_DATA = Path(__file__).resolve().parents[1] / "data" / "nltk"
MIN_KEYWORD_CHARS = 4
MIN_SENTENCE_WORDS = 3  # a "valid sentence structure" (Q_sem p_str) is a sentence of >= 3 words

# Keyword tokens: maximal runs of letters/digits of >= 4 characters, i.e. the tokens of an
# alphanumeric tokeniser that pass the length filter, found in one pass (``\w`` on text whose
# underscores were blanked: the same runs as ``[^\W_]``, matched faster).
_KEYWORD_TOKEN = re.compile(rf"\w{{{MIN_KEYWORD_CHARS},}}")
_WORD_TOKEN = re.compile(r"\w+")
# A sentence ends at . ! or ? (optionally followed by closing quotes/brackets) before whitespace or the end.
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u2019\u201d)\]]*(?:\s+|$)")
_TERMINATOR = re.compile(r"[.!?]")


@lru_cache(maxsize=1)
def stopwords() -> frozenset[str]:
    """NLTK's English stop words, read once from the shipped corpus (no network, no download)."""
    import nltk.data  # imported on first use: importing nltk takes about a second
    from nltk.corpus.reader import WordListCorpusReader

    path = NLTK_DATA / "corpora" / "stopwords"
    if not (path / "english").is_file():
        raise FileNotFoundError(f"stop word list missing at {path / 'english'}; reinstall ziprl")
    # NLTK >= 3.9 reads only below its data path: register the shipped directory (appended, so a
    # user's own nltk_data keeps precedence for their other corpora; this reader is pinned to ours).
    if str(NLTK_DATA) not in nltk.data.path:
        nltk.data.path.append(str(NLTK_DATA))
    return frozenset(WordListCorpusReader(str(path), ["english"]).words("english"))


def extract_keywords(text: str) -> frozenset[str]:
    """The keyword set K of ``text``: lowercase alphanumeric tokens of >= 4 chars minus stop words."""
    return frozenset(_KEYWORD_TOKEN.findall(text.lower().replace("_", " "))) - stopwords()


@lru_cache(maxsize=256)
def cached_keywords(text: str) -> frozenset[str]:
    """:func:`extract_keywords` memoised for texts scored repeatedly: the question q and observation x."""
    return extract_keywords(text)


def vocabulary_size(text: str) -> int:
    """Distinct lowercase word tokens of ``text`` (the |y|, |x| of S_gen's length term)."""
    return len(set(_WORD_TOKEN.findall(text.lower())))


@lru_cache(maxsize=256)
def cached_vocabulary_size(text: str) -> int:
    """:func:`vocabulary_size` memoised, for the source observation scored many times."""
    return vocabulary_size(text)


def words(text: str) -> list[str]:
    """The words of ``text``: its whitespace-separated tokens (the usual word count, W_y)."""
    return text.split()


def sentences(text: str) -> list[str]:
    """Split on . ! ? (closing quotes/brackets allowed) followed by whitespace or the end; drop empty pieces."""
    return [s for s in (p.strip() for p in _SENTENCE_END.split(text)) if s]


class TextStats(NamedTuple):
    """Counts of a compressed text y that Q_level and Q_sem need."""

    n_words: int  # W_y
    n_sentences: int  # S_y
    n_valid_sentences: int  # sentences with >= MIN_SENTENCE_WORDS words
    has_terminator: bool  # any of . ! ?


def text_stats(text: str) -> TextStats:
    """Word and sentence counts of ``text`` (all zero for an empty text)."""
    sents = sentences(text)
    valid = sum(1 for s in sents if len(s.split()) >= MIN_SENTENCE_WORDS)
    return TextStats(len(text.split()), len(sents), valid, _TERMINATOR.search(text) is not None)
