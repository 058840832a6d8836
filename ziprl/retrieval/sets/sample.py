"""``sample``: the small real sample shipped in ``ziprl/data/sample`` (60 HotpotQA + MuSiQue questions and their
paragraphs; ``scripts/make_sample.py`` rebuilds it); needs no shared data."""

from __future__ import annotations

from pathlib import Path

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import SAMPLE_DIR, DatasetError, DatasetSpec, SharedDir, load_qa_jsonl
from ziprl.retrieval.types import QAExample


def sample_file(name: str) -> Path:
    path = SAMPLE_DIR / name
    if not path.is_file():
        raise DatasetError(f"shipped sample file {path} is missing; reinstall ziprl or run scripts/make_sample.py")
    return path


def questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_qa_jsonl(sample_file("qa.jsonl"))


def corpus(shared_dir: SharedDir, cache_dir: SharedDir) -> Path:
    return sample_file("corpus.jsonl.gz")


SPEC = DATASETS.register("sample", order=0)(DatasetSpec(questions, corpus))
