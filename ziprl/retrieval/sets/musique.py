"""``musique``: 100 MuSiQue-Ans train questions (HippoRAG's subset) with supporting titles, against the pooled
corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import DatasetSpec, SharedDir, field_of, records, shared_file, unique
from ziprl.retrieval.types import QAExample

TRAIN = "musique/hipporag_musique_train_subset100.json.gz"
TRAIN_CORPUS = "musique/hipporag_musique_train_subset100_corpus.json.gz"


def musique_answers(r: Any, path: Path, n: int) -> list[str]:
    return unique([field_of(r, "answer", str, path, n), *map(str, field_of(r, "answer_aliases", list, path, n))])


def load_musique_train(path: str | Path) -> list[QAExample]:
    """HippoRAG MuSiQue-Ans train subset; answers = answer + aliases, titles of ``is_supporting`` paragraphs."""
    path = Path(path)
    out = []
    for n, r in enumerate(records(path)):
        paragraphs = field_of(r, "paragraphs", list, path, n)
        out.append(QAExample(
            id=field_of(r, "id", str, path, n), question=field_of(r, "question", str, path, n).strip(),
            answers=musique_answers(r, path, n),
            supporting_titles=unique(field_of(p, "title", str, path, n) for p in paragraphs if p.get("is_supporting")),
            source="musique-train",
        ))
    return out


def musique_train_paragraphs(path: str | Path) -> list[tuple[str, str]]:
    """(title, text) of the HippoRAG MuSiQue corpus file (``[{title, text}]``)."""
    path = Path(path)
    return [(field_of(r, "title", str, path, n), field_of(r, "text", str, path, n)) for n, r in enumerate(records(path))]


def questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_musique_train(shared_file(TRAIN, shared_dir))


SPEC = DATASETS.register("musique", order=2)(DatasetSpec(questions, "pooled", (TRAIN, TRAIN_CORPUS)))
