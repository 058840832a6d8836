"""Tiny exact retrievers over a few hand-written passages, for tests and benchmarks of the env protocol."""

from __future__ import annotations

import re

from ziprl.retrieval.types import Hit, Passage


class WordRetriever:
    """A tiny exact retriever for unit tests of the env protocol: ranks passages by shared words.

    It has no size (``__len__``), so the env does not check ``env.top_k`` against its few passages."""

    def __init__(self, passages: list[Passage]):
        self.passages = {p.doc_id: p for p in passages}

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        out = []
        for q in queries:
            words = set(re.findall(r"\w+", q.lower()))
            ranked = sorted(self.passages.values(),
                            key=lambda p: (-len(words & set(re.findall(r"\w+", (p.title + " " + p.text).lower()))), p.doc_id))
            out.append([Hit(p.doc_id, p.title, p.text[:200], 1.0) for p in ranked[:k]])
        return out

    def open(self, doc_id: str) -> Passage:
        return self.passages[doc_id]


class SizedWordRetriever(WordRetriever):
    """A WordRetriever with a size and random access: what env.retrieval_noise needs (and env.top_k is checked)."""

    def __len__(self) -> int:
        return len(self.passages)

    def hit_at(self, row: int) -> Hit:
        p = list(self.passages.values())[row]
        return Hit(p.doc_id, p.title, p.text[:200], 0.0)


PASSAGES = [
    Passage("d1", "Scott Derrickson", "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and "
            "producer. He lives in Los Angeles, California. He is best known for directing horror films such as "
            "Sinister and The Exorcism of Emily Rose."),
    Passage("d2", "Ed Wood", "Edward Davis Wood Jr. (October 10, 1924 – December 10, 1978) was an American filmmaker, "
            "actor, writer, producer, and director. In the 1950s, Wood made a number of low-budget films."),
    Passage("d3", "Paris", "Paris is the capital and most populous city of France. It has an estimated population "
            "of 2,102,650 residents. The city is a major railway, highway, and air-transport hub."),
]
