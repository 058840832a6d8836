"""Noisy retrieval (the paper's robustness experiment): retrieved passages replaced by random corpus passages.

Each hit of a search is replaced, with probability ``p``, by a uniformly random *other* passage of the corpus,
rendered exactly as a search renders it (its real id, title and snippet), so the agent cannot tell which.
``open`` is not noised: a doc id always opens its own passage, so an injected hit opens consistently.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ziprl.retrieval.types import Hit, RetrieverLike


def noise_rng(seed_seq: np.random.SeedSequence) -> np.random.Generator:
    """A noise stream spawned from the env's seed sequence: replays with the reset seed, never draws from it."""
    return np.random.default_rng(seed_seq.spawn(1)[0])


def check_noise_retriever(retriever: RetrieverLike) -> None:
    """ValueError unless the retriever offers the random access that noise needs."""
    missing = [m for m in ("__len__", "hit_at") if not callable(getattr(retriever, m, None))]
    if missing:
        raise ValueError(f"env.retrieval_noise > 0 needs a retriever with __len__() and hit_at(row) "
                         f"(see ziprl.retrieval.types.RetrieverLike); {type(retriever).__name__} lacks {', '.join(missing)}: "
                         "add them or set env.retrieval_noise=0")


def inject_noise(hits: list[Hit], p: float, retriever: RetrieverLike, rng: np.random.Generator) -> tuple[list[Hit], list[str]]:
    """Hits with each one replaced w.p. ``p`` by a random other passage; returns (hits, ids of injected passages)."""
    if p <= 0.0 or not hits:
        return hits, []
    n = len(retriever)
    if n < 2:
        return hits, []
    out, injected = [], []
    for hit in hits:
        if rng.random() >= p:
            out.append(hit)
            continue
        new = hit
        while new.doc_id == hit.doc_id:  # a replacement is always a different passage (n >= 2 ends this)
            new = retriever.hit_at(int(rng.integers(n)))
        out.append(dataclasses.replace(new, score=hit.score))
        injected.append(new.doc_id)
    return out, injected
