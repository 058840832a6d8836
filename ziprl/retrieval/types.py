"""Plain data types of the retrieval layer (passages, hits, QA examples) and the ``RetrieverLike`` protocol the env
searches through; here so that retrieval and the env (which imports retrieval) share them. No torch, no ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Passage:
    """A corpus document: what `open` returns."""

    doc_id: str
    title: str
    text: str
    url: str = ""


@dataclass(frozen=True)
class Hit:
    """One ranked search result."""

    doc_id: str
    title: str
    snippet: str
    score: float
    url: str = ""


@dataclass
class QAExample:
    """One question in the unified schema of every dataset loader."""

    id: str
    question: str
    answers: list[str]
    supporting_titles: list[str] = field(default_factory=list)
    source: str = ""


class RetrieverLike(Protocol):
    """What SearchCompressEnv needs from a retriever (in-process FAISS or a Ray Serve handle wrapper)."""

    def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...

    def open(self, doc_id: str) -> Passage: ...

    def __len__(self) -> int: ...  # corpus size (env.retrieval_noise; a known size is checked against env.top_k)

    def hit_at(self, row: int) -> Hit: ...  # passage ``row`` (0..len-1) rendered as search renders it
