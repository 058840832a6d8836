"""QA datasets in one schema (:class:`QAExample`) and the corpora that go with them.

A name for :func:`load_dataset` and :func:`corpus_for` is a named dataset, registered in
:data:`ziprl.registry.DATASETS` by one module of ``ziprl/retrieval/sets/`` each (a :class:`DatasetSpec`: its
questions, its corpus, the shared-data files it reads), or a path to a unified-schema ``.jsonl`` file, whose corpus
is ``corpus.jsonl[.gz]`` next to it. Registered:

- ``sample``: the small real sample shipped in ``ziprl/data/sample`` (needs nothing else).
- ``hotpotqa``: HotpotQA questions whose paragraphs are in the pooled corpus (100 train from HippoRAG with
  supporting titles, then the first 300 dev questions of the distractor setting, which have none).
- ``musique``: 100 MuSiQue-Ans train questions (HippoRAG subset) with supporting titles.
- ``pooled``: hotpotqa + musique (500 questions); all are retrieved against the pooled corpus.
- ``hotpotqa-dev`` (7,405), ``musique-dev`` (2,417), ``squad`` (10,570): open-domain question/answer
  sets whose paragraphs are not available; :func:`corpus_for` gives them the pooled corpus and warns.
- ``wiki18``: corpus only (1,000 FlashRAG wiki18 passages).

The pooled corpus = every paragraph of the HotpotQA and MuSiQue sets above plus the wiki18 sample,
whitespace-normalised and de-duplicated on (title, text), with stable source-derived ids; it is
materialised once under ``<cache>/corpora/`` keyed by the source files' hash.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError
from ziprl.config import RetrieverConfig, ZipRLConfig
from ziprl.paths import cache_root
from ziprl.registry import DATASETS
from ziprl.retrieval.corpus import write_corpus
from ziprl.retrieval.types import Passage, QAExample

log = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "sample"
SHARED_ENV = "ZIPRL_SHARED_DATA"
POOLED_VERSION = "pooled-v1"  # bump when the pooled-corpus construction changes

class DatasetError(UserError, ValueError):
    """A dataset is unknown, missing or malformed; the message says which file and how to fix it."""


SharedDir = str | Path | None


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset: what :data:`ziprl.registry.DATASETS` holds.

    ``questions(shared_dir)`` loads every question (None: a corpus only); ``corpus`` is either
    ``(shared_dir, cache_dir) -> path of its JSONL corpus`` or the name of the dataset whose corpus it shares;
    ``files`` are the shared-data files it reads (relative to the shared data dir); ``open_domain``: its questions'
    paragraphs are not in its corpus (:func:`corpus_for` warns).
    """

    questions: Callable[[SharedDir], list[QAExample]] | None
    corpus: Callable[[SharedDir, SharedDir], Path] | str
    files: tuple[str, ...] = ()
    open_domain: bool = False


# ---------------------------------------------------------------- locations


def default_shared_dir() -> Path:
    """``$ZIPRL_SHARED_DATA`` if set, else ``<repo>/../shared/data`` resolved from the package location."""
    env = os.environ.get(SHARED_ENV)
    path = Path(env).expanduser() if env else Path(__file__).resolve().parents[3] / "shared" / "data"
    if not path.is_dir():
        origin = f"${SHARED_ENV}" if env else "the default <repo>/../shared/data"
        raise DatasetError(
            f"shared data directory {path} ({origin}) does not exist; set {SHARED_ENV}=/path/to/shared/data "
            "or pass shared_dir (data.shared_dir in the config). The shipped 'sample' dataset needs neither."
        )
    return path


def shared_file(rel: str, shared_dir: SharedDir = None) -> Path:
    """Path of a dataset's file ``rel`` (a :attr:`DatasetSpec.files` entry) under the shared data dir; DatasetError
    when it is missing."""
    root = Path(shared_dir).expanduser() if shared_dir is not None else default_shared_dir()
    path = root / rel
    if not path.is_file():
        raise DatasetError(f"dataset file {path} is missing; expected {rel} under the shared data dir {root}")
    return path


# ---------------------------------------------------------------- reading helpers


def _read_json(path: Path) -> Any:
    """A (gzipped) JSON document, or a list of records for JSONL; DatasetError with the line on bad JSON."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DatasetError(f"dataset file {path} cannot be read as UTF-8 (gzipped) JSON: {exc}") from None
    if ".jsonl" not in path.name:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"dataset file {path}: malformed JSON at line {exc.lineno} ({exc.msg})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"dataset file {path} line {n}: malformed JSON ({exc.msg})") from None
    return rows


def records(path: Path, container: type = list) -> Any:
    data = _read_json(path)
    if not isinstance(data, container):
        raise DatasetError(f"dataset file {path}: expected a JSON {container.__name__}, got {type(data).__name__}")
    return data


def field_of(rec: Any, key: str, tp: type | tuple[type, ...], path: Path, n: int) -> Any:
    """``rec[key]`` checked against ``tp``; DatasetError naming file, record and field otherwise."""
    if not isinstance(rec, dict) or key not in rec or not isinstance(rec[key], tp):
        got = "missing" if not isinstance(rec, dict) or key not in rec else type(rec[key]).__name__
        want = tp.__name__ if isinstance(tp, type) else "/".join(t.__name__ for t in tp)
        raise DatasetError(f"dataset file {path} record {n}: field {key!r} is {got}, expected {want}; is this the right file?")
    return rec[key]


def clean(s: str) -> str:
    return " ".join(s.split())


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# ---------------------------------------------------------------- corpora built from shared files


def _files_hash(paths: Iterable[Path], salt: str) -> str:
    h = hashlib.sha256(salt.encode())
    for p in paths:
        h.update(p.name.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def materialise(name: str, files: tuple[str, ...], build: Callable[[], list[Passage]], shared_dir: SharedDir,
                cache_dir: SharedDir) -> Path:
    """The JSONL corpus ``build()`` makes from ``files``, written once under ``<cache>/corpora/`` (or ``cache_dir``),
    keyed by the files' content."""
    paths = [shared_file(rel, shared_dir) for rel in files]
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / "corpora"
    out = root / f"{name}-{_files_hash(paths, POOLED_VERSION)}.jsonl"
    if out.is_file():
        return out
    log.info("materialising the %s corpus into %s", name, out)
    return write_corpus(build(), out)


# ---------------------------------------------------------------- unified schema


def load_qa_jsonl(path: str | Path) -> list[QAExample]:
    """A unified-schema QA file: one ``{id, question, answers, supporting_titles?, source?}`` per line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetError(f"QA file {path} does not exist; pass a dataset name ({', '.join(DATASETS)}) or the path "
                           "of a unified-schema .jsonl file")
    out: list[QAExample] = []
    seen: dict[str, int] = {}
    for n, r in enumerate(records(path), start=1):
        ex = QAExample(
            id=field_of(r, "id", str, path, n), question=field_of(r, "question", str, path, n).strip(),
            answers=field_of(r, "answers", list, path, n), supporting_titles=r.get("supporting_titles", []),
            source=r.get("source", ""),
        )
        if not ex.question.strip() or not ex.answers or not all(isinstance(a, str) and a.strip() for a in ex.answers):
            raise DatasetError(f"QA file {path} record {n}: needs a non-empty question and a list of non-empty answers")
        if not isinstance(ex.supporting_titles, list) or not all(isinstance(t, str) for t in ex.supporting_titles):
            raise DatasetError(f"QA file {path} record {n}: supporting_titles must be a list of strings")
        if ex.id in seen:
            raise DatasetError(f"QA file {path}: duplicate id {ex.id!r} in records {seen[ex.id]} and {n}")
        seen[ex.id] = n
        out.append(ex)
    if not out:
        raise DatasetError(f"QA file {path} holds no questions")
    return out


def write_qa_jsonl(examples: Iterable[QAExample], path: str | Path) -> Path:
    """Write examples in the unified schema (one JSON object per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": e.id, "question": e.question, "answers": e.answers,
                         "supporting_titles": e.supporting_titles, "source": e.source}, ensure_ascii=False)
             for e in examples]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- public entry points


def _is_path(name: str) -> bool:
    return name.endswith((".jsonl", ".jsonl.gz")) or os.sep in name or Path(name).expanduser().is_file()


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; use one of {', '.join(DATASETS)} or a path to a "
                           "unified-schema .jsonl file")
    return DATASETS[name]


def _load_all(name: str, shared_dir: SharedDir) -> list[QAExample]:
    if name not in DATASETS and _is_path(name):
        return load_qa_jsonl(name)
    spec = _spec(name)
    if spec.questions is None:
        raise DatasetError(f"{name!r} is a corpus only (no questions); use corpus_for({name!r})")
    return spec.questions(shared_dir)


def load_dataset(name: str, shared_dir: str | Path | None = None, limit: int | None = None,
                 seed: int = 0) -> list[QAExample]:
    """Questions of dataset ``name`` (see module doc); ``limit`` keeps a seeded random subset, in order."""
    examples = _load_all(name, shared_dir)
    if limit is None or limit >= len(examples):
        return examples
    if limit < 1:
        raise DatasetError(f"limit must be >= 1 (or None for all), got {limit}")
    keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


def corpus_for(name: str, shared_dir: SharedDir = None, cache_dir: SharedDir = None) -> Path:
    """Path of the JSONL corpus that goes with dataset ``name`` (materialising a built one on first use)."""
    if name not in DATASETS and _is_path(name):
        qa = Path(name).expanduser()
        for cand in ("corpus.jsonl", "corpus.jsonl.gz"):
            if (qa.parent / cand).is_file():
                return qa.parent / cand
        raise DatasetError(f"no corpus.jsonl or corpus.jsonl.gz next to {qa}; set retriever.corpus to its corpus")
    spec = _spec(name)
    if spec.open_domain:
        log.warning("%s is open-domain: its questions are not aligned with the corpus it is given", name)
    if isinstance(spec.corpus, str):
        return corpus_for(spec.corpus, shared_dir, cache_dir)
    return spec.corpus(shared_dir, cache_dir)


def retriever_config_for(cfg: ZipRLConfig) -> RetrieverConfig:
    """The retriever for the configured dataset: the shipped sample index, or the pooled corpus's index."""
    r = cfg.retriever
    if cfg.data.dataset == "sample" or r.corpus or r.index_dir:
        return r
    return dataclasses.replace(r, corpus=str(corpus_for(cfg.data.dataset, cfg.data.shared_dir)))
