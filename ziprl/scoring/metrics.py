"""Answer metrics (the outcome reward): SQuAD-style normalisation, exact match and token F1."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation and the articles a/an/the, collapse whitespace (SQuAD v1.1)."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold, else 0.0 (an empty prediction scores 0)."""
    pred = normalize_answer(prediction)
    if not pred:
        return 0.0
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: str | Iterable[str]) -> float:
    """Token-level F1 of the normalised prediction, the max over golds (an empty prediction scores 0)."""
    pred = normalize_answer(prediction).split()
    if not pred:
        return 0.0
    return max((_f1(pred, normalize_answer(g).split()) for g in _golds(golds)), default=0.0)
