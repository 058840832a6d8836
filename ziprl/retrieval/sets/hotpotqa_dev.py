"""``hotpotqa-dev``: all 7,405 HotpotQA dev questions, open-domain (their paragraphs are not in the pooled corpus
it is given)."""

from __future__ import annotations

from pathlib import Path

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import DatasetSpec, SharedDir, field_of, records, shared_file
from ziprl.retrieval.types import QAExample

DEV = "hotpotqa/hotpot_dev_qa.json.gz"


def load_hotpot_dev(path: str | Path) -> list[QAExample]:
    """All 7,405 HotpotQA dev questions, question + answer only (open-domain)."""
    path = Path(path)
    return [QAExample(id=f"hotpotqa-dev-{n}", question=field_of(r, "question", str, path, n).strip(),
                      answers=[field_of(r, "answer", str, path, n)], source="hotpotqa-dev")
            for n, r in enumerate(records(path))]


def questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_hotpot_dev(shared_file(DEV, shared_dir))


SPEC = DATASETS.register("hotpotqa-dev", order=4)(DatasetSpec(questions, "pooled", (DEV,), open_domain=True))
