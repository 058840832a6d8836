"""``invented`` and ``invented-heldout``: questions about invented towns, people and organisations, shipped in
``ziprl/data/invented`` (``scripts/make_invented.py`` rebuilds it from a seed; see its README.md); needs no shared
data.

No model can know the answers from pre-training, so they come from searching. ``invented`` holds the training
questions, ``invented-heldout`` questions about other entities, which no training question (and so no
demonstration) names; both search one corpus of every entity's passage (:mod:`ziprl.retrieval.sets.invented_world`).
"""

from __future__ import annotations

from pathlib import Path

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import DatasetError, DatasetSpec, SharedDir, load_qa_jsonl
from ziprl.retrieval.types import QAExample

INVENTED_DIR = Path(__file__).resolve().parents[2] / "data" / "invented"


def invented_file(name: str) -> Path:
    path = INVENTED_DIR / name
    if not path.is_file():
        raise DatasetError(f"shipped file {path} is missing; reinstall ziprl or run scripts/make_invented.py")
    return path


def train_questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_qa_jsonl(invented_file("train.jsonl"))


def heldout_questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_qa_jsonl(invented_file("heldout.jsonl"))


def corpus(shared_dir: SharedDir, cache_dir: SharedDir) -> Path:
    return invented_file("corpus.jsonl.gz")


SPEC = DATASETS.register("invented", order=8)(DatasetSpec(train_questions, corpus))
HELDOUT_SPEC = DATASETS.register("invented-heldout", order=9)(DatasetSpec(heldout_questions, "invented"))
