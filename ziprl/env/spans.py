"""Short spans read off text, never off the gold answer: a question's capitalised phrases (queries worth searching)
and candidate answer spans of the observations (dates, capitalised phrases, numbers). The tools' candidate actions
for the tokenized env (:mod:`ziprl.integrations.rllib`) use them."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ziprl.env.protocol import HIT_LINE_RE
from ziprl.scoring.keywords import extract_keywords, sentences, stopwords
from ziprl.scoring.metrics import normalize_answer

_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_SPAN_RES = (
    re.compile(rf"\b{_MONTH} \d{{1,2}}, \d{{4}}\b|\b\d{{1,2}} {_MONTH} \d{{4}}\b"),  # dates
    re.compile(r"\b[A-Z][\w'’-]*(?:(?:\s+(?:of|the|de|von|van))?\s+[A-Z][\w'’-]*)*"),  # capitalised phrases
    re.compile(r"\b\d[\d,]*(?:\.\d+)?\b"),  # numbers and years
)
_PHRASE_RE = re.compile(r"\b[A-Z][\w'’-]*(?:\s+[A-Z][\w'’-]*)*")
_YES_NO = {"is", "are", "was", "were", "do", "does", "did", "can", "could", "has", "have", "had", "will", "would",
           "should"}


def _strip_stopwords(phrase: str) -> str:
    """Drop leading and trailing stop words ("Were Scott Derrickson" -> "Scott Derrickson")."""
    words, stop = phrase.split(), stopwords()
    while words and words[0].lower() in stop:
        words.pop(0)
    while words and words[-1].lower() in stop:
        words.pop()
    return " ".join(words)


def question_phrases(question: str) -> list[str]:
    """Capitalised phrases of the question (stop words trimmed), in order, de-duplicated."""
    return list(dict.fromkeys(p for p in map(_strip_stopwords, _PHRASE_RE.findall(question)) if p))


def is_yes_no(question: str) -> bool:
    """True for questions that open with an auxiliary verb ("Were ...?", "Is ...?")."""
    first = question.split()[:1]
    return bool(first) and first[0].lower() in _YES_NO


def answer_spans(question: str, texts: Sequence[str], limit: int) -> list[str]:
    """Short answer spans (dates, capitalised phrases, numbers) found in ``texts``, best first.

    A span ranks by the question keywords its sentence shares, then by position; spans made only of the
    question's own words are skipped. Yes/no questions get "yes" and "no" first.
    """
    qk, q_words = extract_keywords(question), set(normalize_answer(question).split())
    scored: list[tuple[int, int, str]] = []
    for text in texts:
        for line in text.splitlines():
            for sent in sentences(HIT_LINE_RE.sub(r"\2", line)):
                overlap, taken = len(qk & extract_keywords(sent)), set()
                for pattern in _SPAN_RES:  # in priority order: a span inside an earlier one is skipped
                    for m in pattern.finditer(sent):
                        if taken & set(range(*m.span())):
                            continue
                        taken |= set(range(*m.span()))
                        span = _strip_stopwords(m.group(0).strip(" ,"))
                        norm = normalize_answer(span).split()
                        if norm and not set(norm) <= q_words:
                            scored.append((-overlap, len(scored), span))
    spans = ["yes", "no"] if is_yes_no(question) else []
    seen = {normalize_answer(s) for s in spans}
    for _, _, span in sorted(scored):
        if normalize_answer(span) not in seen:
            seen.add(normalize_answer(span))
            spans.append(span)
    return spans[:limit]
