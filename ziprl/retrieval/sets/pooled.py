"""``pooled``: hotpotqa + musique (500 questions), and the pooled corpus they (and the open-domain sets) are
retrieved against: every paragraph of the HotpotQA and MuSiQue sets plus the wiki18 sample, whitespace-normalised
and de-duplicated on (title, text), with stable source-derived ids."""

from __future__ import annotations

from pathlib import Path

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import (
    DatasetSpec,
    SharedDir,
    clean,
    field_of,
    materialise,
    records,
    shared_file,
)
from ziprl.retrieval.sets import hotpotqa, musique, wiki18
from ziprl.retrieval.types import Passage, QAExample

SOURCES = (hotpotqa.TRAIN_CORPUS, musique.TRAIN_CORPUS, hotpotqa.DISTRACTOR, wiki18.PASSAGES)  # hash order


def pooled_passages(shared_dir: SharedDir = None) -> list[Passage]:
    """Every paragraph of the pooled sets, whitespace-normalised, de-duplicated on (title, text)."""
    hotpot, mus, distractor, wiki = (shared_file(rel, shared_dir) for rel in SOURCES)
    rows: list[tuple[str, str, str]] = []
    rows += [(f"hotpot-train-{i}", t, x) for i, (t, x) in enumerate(hotpotqa.hotpot_train_paragraphs(hotpot))]
    rows += [(f"musique-train-{i}", t, x) for i, (t, x) in enumerate(musique.musique_train_paragraphs(mus))]
    rows += [(f"hotpot-dev-{q}-{j}", t, x) for q, pars in hotpotqa.hotpot_distractor_paragraphs(distractor).items()
             for j, (t, x) in enumerate(pars)]
    rows += [(p.doc_id, p.title, p.text) for p in wiki18.wiki18_passages(wiki)]
    seen: set[tuple[str, str]] = set()
    out = []
    for doc_id, title, text in rows:
        key = (clean(title), clean(text))
        if key[0] and key[1] and key not in seen:
            seen.add(key)
            out.append(Passage(doc_id=doc_id, title=key[0], text=key[1]))
    return out


def context_paragraphs(shared_dir: SharedDir = None) -> dict[str, list[tuple[str, str]]]:
    """Pooled question id -> its context paragraphs as (title, text), normalised as in the pooled corpus."""
    out: dict[str, list[tuple[str, str]]] = {}
    path = shared_file(hotpotqa.TRAIN, shared_dir)
    for n, r in enumerate(records(path)):
        context = field_of(r, "context", list, path, n)
        out[field_of(r, "_id", str, path, n)] = [(clean(t), clean("".join(s))) for t, s in context]
    path = shared_file(musique.TRAIN, shared_dir)
    for n, r in enumerate(records(path)):
        paragraphs = field_of(r, "paragraphs", list, path, n)
        out[field_of(r, "id", str, path, n)] = [(clean(p["title"]), clean(p["paragraph_text"])) for p in paragraphs]
    for q, pars in hotpotqa.hotpot_distractor_paragraphs(shared_file(hotpotqa.DISTRACTOR, shared_dir)).items():
        out[f"hotpotqa-dev-distractor-{q}"] = [(clean(t), clean(x)) for t, x in pars]
    return out


def questions(shared_dir: SharedDir) -> list[QAExample]:
    return hotpotqa.questions(shared_dir) + musique.questions(shared_dir)


def corpus(shared_dir: SharedDir, cache_dir: SharedDir) -> Path:
    return materialise("pooled", SOURCES, lambda: pooled_passages(shared_dir), shared_dir, cache_dir)


SPEC = DATASETS.register("pooled", order=3)(DatasetSpec(questions, corpus, SOURCES))
