"""``squad``: all 10,570 SQuAD v1.1 dev questions, open-domain (without their contexts)."""

from __future__ import annotations

from pathlib import Path

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import DatasetSpec, SharedDir, field_of, records, shared_file
from ziprl.retrieval.types import QAExample

DEV = "squad/squad_v1.1_dev_qa.jsonl.gz"


def load_squad_dev(path: str | Path) -> list[QAExample]:
    """All 10,570 SQuAD v1.1 dev questions with their distinct gold answers (no contexts)."""
    path = Path(path)
    return [QAExample(id=f"squad-dev-{n}", question=field_of(r, "question", str, path, n).strip(),
                      answers=[str(a) for a in field_of(r, "answer", list, path, n)], source="squad-dev")
            for n, r in enumerate(records(path))]


def questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_squad_dev(shared_file(DEV, shared_dir))


SPEC = DATASETS.register("squad", order=6)(DatasetSpec(questions, "pooled", (DEV,), open_domain=True))
