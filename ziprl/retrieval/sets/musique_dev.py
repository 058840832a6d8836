"""``musique-dev``: all 2,417 MuSiQue-Ans dev questions, open-domain (without their paragraphs)."""

from __future__ import annotations

from pathlib import Path

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import DatasetSpec, SharedDir, field_of, records, shared_file
from ziprl.retrieval.sets.musique import musique_answers
from ziprl.retrieval.types import QAExample

DEV = "musique/musique_ans_v1.0_dev.no_paragraphs.json.gz"


def load_musique_dev(path: str | Path) -> list[QAExample]:
    """All 2,417 MuSiQue-Ans dev questions without paragraphs (open-domain)."""
    path = Path(path)
    return [QAExample(id=field_of(r, "id", str, path, n), question=field_of(r, "question", str, path, n).strip(),
                      answers=musique_answers(r, path, n), source="musique-dev")
            for n, r in enumerate(records(path))]


def questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_musique_dev(shared_file(DEV, shared_dir))


SPEC = DATASETS.register("musique-dev", order=5)(DatasetSpec(questions, "pooled", (DEV,), open_domain=True))
