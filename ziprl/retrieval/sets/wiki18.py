"""``wiki18``: a corpus only, 1,000 FlashRAG wiki18 passages (no questions)."""

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
from ziprl.retrieval.types import Passage

PASSAGES = "wiki18_passages_sample/flashrag_wiki18_sample_1000.jsonl.gz"


def wiki18_passages(path: str | Path) -> list[Passage]:
    """FlashRAG wiki18 passages (``contents = '"<title>"\\n<text>'``); ids ``wiki18-<id>``."""
    path = Path(path)
    out = []
    for n, r in enumerate(records(path)):
        doc_id, contents = field_of(r, "id", str, path, n), field_of(r, "contents", str, path, n)
        title, _, text = contents.partition("\n")
        if len(title) > 1 and title[0] == title[-1] == '"':
            title = title[1:-1]
        out.append(Passage(doc_id=f"wiki18-{doc_id}", title=clean(title), text=clean(text)))
    return out


def corpus(shared_dir: SharedDir, cache_dir: SharedDir) -> Path:
    return materialise("wiki18", (PASSAGES,), lambda: wiki18_passages(shared_file(PASSAGES, shared_dir)), shared_dir,
                       cache_dir)


SPEC = DATASETS.register("wiki18", order=7)(DatasetSpec(None, corpus, (PASSAGES,)))
