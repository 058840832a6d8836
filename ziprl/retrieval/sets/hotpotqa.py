"""``hotpotqa``: HotpotQA questions whose paragraphs are in the pooled corpus: 100 train questions (HippoRAG's
subset, with supporting titles), then the first 300 dev questions of the distractor setting (none)."""

from __future__ import annotations

import re
from pathlib import Path

from ziprl.registry import DATASETS
from ziprl.retrieval.datasets import (
    DatasetError,
    DatasetSpec,
    SharedDir,
    field_of,
    records,
    shared_file,
    unique,
)
from ziprl.retrieval.types import QAExample

TRAIN = "hotpotqa/hipporag_hotpotqa_train_subset100.json.gz"
TRAIN_CORPUS = "hotpotqa/hipporag_hotpotqa_train_subset100_corpus.json.gz"
DISTRACTOR = "hotpotqa/hotpot_dev_distractor_first300_documents.json.gz"


def load_hotpot_train(path: str | Path) -> list[QAExample]:
    """HippoRAG HotpotQA train subset (official schema); supporting titles from ``supporting_facts``."""
    path = Path(path)
    out = []
    for n, r in enumerate(records(path)):
        facts = field_of(r, "supporting_facts", list, path, n)
        out.append(QAExample(
            id=field_of(r, "_id", str, path, n), question=field_of(r, "question", str, path, n).strip(),
            answers=[field_of(r, "answer", str, path, n)], supporting_titles=unique(str(f[0]) for f in facts),
            source="hotpotqa-train",
        ))
    return out


def hotpot_train_paragraphs(path: str | Path) -> list[tuple[str, str]]:
    """(title, text) pairs of the HippoRAG HotpotQA corpus file (``{title: [sentences]}``)."""
    path = Path(path)
    out = []
    for n, (title, sentences) in enumerate(records(path, dict).items()):
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise DatasetError(f"dataset file {path} entry {n} ({title!r}): expected a list of sentence strings")
        out.append((title, "".join(sentences)))
    return out


_ABBREVIATIONS = {"st", "jr", "sr", "dr", "mr", "mrs", "ms", "mt", "ft", "no", "co", "inc", "ltd", "corp", "bros",
                  "vs", "v", "op", "vol", "rev", "gen", "col", "lt", "capt", "sgt", "gov", "sen", "prof", "ave"}


def _plausible_title(title: str) -> bool:
    """False when ``title`` ends in an abbreviation ("F.C", "U.S", "St", "Jr", an initial), not a title end."""
    if title.endswith("."):  # "Edgar Kaiser Jr.. Edgar Fosburgh Kaiser Jr. (...)"
        return True
    words = [w.rstrip(".") for w in title.split()]
    last = words[-1] if words else ""
    if len(last) == 1 and last in "IVX" and len(words) > 1 and len(words[-2]) > 1:
        return True  # a regnal number: "Khosrow V"
    return not ("." in last or len(last) == 1 or last.lower() in _ABBREVIATIONS)


def split_title(paragraph: str) -> tuple[str, str]:
    """Split a distractor-file paragraph ``"<title>. <sentence>  <sentence>..."`` into (title, text).

    The title may itself contain ". " ("St. Louis", "F.C. season"). Preference: the first split whose
    text starts by repeating the title, then the first plausible split inside the first sentence, then
    the first plausible split, then the first split.
    """
    head_len = len(paragraph.split("  ", 1)[0])
    cands = [m.start() for m in re.finditer(r"\. ", paragraph) if m.start() <= head_len]
    if not cands:
        raise DatasetError(f"cannot find the '<title>. ' prefix in paragraph {paragraph[:80]!r}")
    splits = [(paragraph[:i], paragraph[i + 2:].strip()) for i in cands]
    for title, rest in splits:
        low, t = rest.lower(), title.lower()
        if low.startswith((t, f"the {t}", f"a {t}", f'"{t}')):
            return title, rest
    inner = [s for i, s in zip(cands, splits, strict=True) if i < head_len - 1]
    return next((s for s in [*inner, *splits] if _plausible_title(s[0])), splits[0])


def load_hotpot_distractor(path: str | Path) -> list[QAExample]:
    """First 300 HotpotQA dev questions (distractor setting); no supporting facts in this file."""
    path = Path(path)
    out = []
    for n, r in enumerate(records(path)):
        answers = field_of(r, "answers", list, path, n)
        out.append(QAExample(
            id=f"hotpotqa-dev-distractor-{field_of(r, 'id', int, path, n)}", question=field_of(r, "question", str, path, n).strip(),
            answers=[str(a) for a in answers], source="hotpotqa-dev-distractor",
        ))
    return out


def hotpot_distractor_paragraphs(path: str | Path) -> dict[int, list[tuple[str, str]]]:
    """Question id -> its context paragraphs as (title, text), from the distractor file's ``document``."""
    path = Path(path)
    out = {}
    for n, r in enumerate(records(path)):
        doc = field_of(r, "document", str, path, n)
        out[field_of(r, "id", int, path, n)] = [split_title(p.strip()) for p in doc.split("\n\n") if p.strip()]
    return out


def questions(shared_dir: SharedDir) -> list[QAExample]:
    return load_hotpot_train(shared_file(TRAIN, shared_dir)) + load_hotpot_distractor(shared_file(DISTRACTOR, shared_dir))


SPEC = DATASETS.register("hotpotqa", order=1)(DatasetSpec(questions, "pooled", (TRAIN, TRAIN_CORPUS, DISTRACTOR)))
