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

The named sets beyond ``sample`` and ``invented`` read their files from a data directory the user gives:
``data.shared_dir`` in the config, else ``$ZIPRL_DATA`` (docs/data.md lists the files and where to get them); with
neither, loading one of them is a :class:`DatasetError` that says so.

The pooled corpus = every paragraph of the HotpotQA and MuSiQue sets above plus the wiki18 sample,
whitespace-normalised and de-duplicated on (title, text), with stable source-derived ids; it is
materialised once under ``<cache>/corpora/`` keyed by the source files' hash.

Every question is checked when its dataset loads (:func:`check_question`): one holding a lone surrogate, or
longer than ``data.max_question_chars``, is refused with its file and line (or dataset) and id, never truncated. A
QA file's gold answer must keep a word after EM/F1 normalisation (not only punctuation and articles).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import os
import random
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError
from ziprl.config import DataConfig, RetrieverConfig, ZipRLConfig
from ziprl.paths import atomic_write_text, cache_root, file_sha256, not_a_file
from ziprl.registry import DATASETS
from ziprl.retrieval.corpus import LONE_SURROGATE, json_array_hint, write_corpus
from ziprl.retrieval.types import Passage, QAExample
from ziprl.scoring.metrics import normalize_answer

log = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "sample"
SHARED_ENV = "ZIPRL_DATA"  # the data directory of the named sets beyond the shipped ones
DEPRECATED_SHARED_ENV = "ZIPRL_SHARED_DATA"  # its old name, still read with a DeprecationWarning
WHERE_TO_GET_DATA = ("it holds hotpotqa/, musique/, squad/ and wiki18_passages_sample/ from the public HotpotQA, "
                     "MuSiQue and SQuAD v1.1 releases and a Wikipedia sample (FlashRAG's wiki-18); docs/data.md lists "
                     "the files and where to get each")
POOLED_VERSION = "pooled-v1"  # bump when the pooled-corpus construction changes
MAX_QUESTION_CHARS = DataConfig.max_question_chars  # the default of data.max_question_chars

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
    """The data directory ``$ZIPRL_DATA`` names (``$ZIPRL_SHARED_DATA``, deprecated, when it is unset); DatasetError,
    saying where to get the data, when neither is set or the directory does not exist."""
    name, value = SHARED_ENV, os.environ.get(SHARED_ENV)
    old = os.environ.get(DEPRECATED_SHARED_ENV)
    if old:
        used = f"ignored because {SHARED_ENV} is set" if value else "still read for now"
        warnings.warn(f"{DEPRECATED_SHARED_ENV} is deprecated ({used}): set {SHARED_ENV} instead",
                      DeprecationWarning, stacklevel=2)
        if not value:
            name, value = DEPRECATED_SHARED_ENV, old
    fix = (f"set {SHARED_ENV}=/path/to/data or data.shared_dir (--set data.shared_dir=PATH); {WHERE_TO_GET_DATA}. "
           "The shipped datasets 'sample' and 'invented' need none")
    if not value:
        raise DatasetError(f"this dataset reads its files from a data directory and none is given: {fix}")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DatasetError(f"data directory {path} (${name}) does not exist: {fix}")
    return path


def shared_file(rel: str, shared_dir: SharedDir = None) -> Path:
    """Path of a dataset's file ``rel`` (a :attr:`DatasetSpec.files` entry) under the shared data dir; DatasetError
    when it is missing."""
    root = Path(shared_dir).expanduser() if shared_dir is not None else default_shared_dir()
    path = root / rel
    problem = not_a_file(path)
    if problem:
        raise DatasetError(f"dataset file {path} {problem}; expected the file {rel} under the data directory {root}: "
                           f"{WHERE_TO_GET_DATA}")
    return path


# ---------------------------------------------------------------- reading helpers


def _read_text(path: Path) -> str:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return f.read().removeprefix("\ufeff")  # a byte order mark (an editor's UTF-8 with BOM)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DatasetError(f"dataset file {path} cannot be read as UTF-8 (gzipped) JSON: {exc}") from None


def _jsonl_rows(path: Path, text: str) -> list[tuple[int, Any]]:
    """(line number, record) of every non-blank line; DatasetError on bad JSON or a JSON array.

    Lines end at LF only: U+2028, U+0085 and the other line breaks ``str.splitlines`` knows may sit inside a JSON
    string.
    """
    rows: list[tuple[int, Any]] = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if not rows and line.lstrip().startswith("["):
            raise DatasetError(json_array_hint(path))
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"dataset file {path} line {n}: malformed JSON ({exc.msg})") from None
        except RecursionError:
            raise DatasetError(f"dataset file {path} line {n}: JSON nested too deeply; each line must be one JSON "
                               "object") from None
    return rows


def _is_jsonl(text: str) -> bool:
    """Whether ``text``'s first non-blank line is a JSON object on its own (a JSONL file)."""
    first = next((line for line in text.split("\n") if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except (json.JSONDecodeError, RecursionError):
        return False


def _read_json(path: Path) -> Any:
    """A (gzipped) JSON document, or a list of records for JSONL; DatasetError with the line on bad JSON."""
    text = _read_text(path)
    if ".jsonl" in path.name:
        return [r for _, r in _jsonl_rows(path, text)]
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        hint = ""
        if exc.msg == "Extra data" and _is_jsonl(text):
            name = path.name.replace(".json", ".jsonl", 1) if ".json" in path.name else path.name + ".jsonl"
            hint = f"; it holds one JSON object per line (JSONL): name it {name}"
        raise DatasetError(f"dataset file {path}: malformed JSON at line {exc.lineno} ({exc.msg}){hint}") from None
    except RecursionError:
        raise DatasetError(f"dataset file {path}: JSON nested too deeply; it must be a JSON list of objects") from None


def records(path: Path, container: type = list) -> Any:
    data = _read_json(path)
    if not isinstance(data, container):
        raise DatasetError(f"dataset file {path}: expected a JSON {container.__name__}, got {type(data).__name__}")
    return data


def field_of(rec: Any, key: str, tp: type | tuple[type, ...], path: Path, n: int, unit: str = "record") -> Any:
    """``rec[key]`` checked against ``tp``; DatasetError naming file, record (or ``unit`` ``n``) and field otherwise."""
    if not isinstance(rec, dict) or key not in rec or not isinstance(rec[key], tp):
        got = "missing" if not isinstance(rec, dict) or key not in rec else type(rec[key]).__name__
        want = tp.__name__ if isinstance(tp, type) else "/".join(t.__name__ for t in tp)
        raise DatasetError(f"dataset file {path} {unit} {n}: field {key!r} is {got}, expected {want}; is this the right "
                           "file?")
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
        h.update(bytes.fromhex(file_sha256(p)))
    return h.hexdigest()[:16]


def materialise(name: str, files: tuple[str, ...], build: Callable[[], list[Passage]], shared_dir: SharedDir,
                cache_dir: SharedDir) -> Path:
    """The JSONL corpus ``build()`` makes from ``files``, written once under ``<cache>/corpora/`` (or ``cache_dir``),
    keyed by the files' content; the sha256 of its bytes is written beside it (``<name>.sha256``), and a file that
    does not match it (cut short, edited, or written before the check) is built again."""
    paths = [shared_file(rel, shared_dir) for rel in files]
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / "corpora"
    out = root / f"{name}-{_files_hash(paths, POOLED_VERSION)}.jsonl"
    digest = out.with_name(out.name + ".sha256")
    if out.is_file() and digest.is_file() and digest.read_text(encoding="utf-8").strip() == file_sha256(out):
        return out
    log.info("materialising the %s corpus into %s", name, out)
    write_corpus(build(), out)
    atomic_write_text(digest, file_sha256(out) + "\n")
    return out


# ---------------------------------------------------------------- unified schema


def check_question(ex: QAExample, where: str, max_chars: int) -> None:
    """DatasetError when a text of ``ex`` holds a lone surrogate (it cannot be written: the trajectories would fail
    after the episodes) or its question is longer than ``max_chars``; ``where`` names its file and line, or dataset."""
    texts = [("id", ex.id), ("question", ex.question), *(("answer", a) for a in ex.answers),
             *(("supporting title", t) for t in ex.supporting_titles), ("source", ex.source)]
    for field, text in texts:
        found = LONE_SURROGATE.search(text)
        if found:
            raise DatasetError(f"{where}: question {ex.id!r} holds a lone surrogate in its {field} "
                               f"(U+{ord(found[0]):04X} at character {found.start()}), which is not a character "
                               "and cannot be written; fix the text (a JSON \\udXXX escape must be half of a pair)")
    if len(ex.question) > max_chars:
        raise DatasetError(f"{where}: question {ex.id!r} is {len(ex.question)} characters, more than "
                           f"data.max_question_chars={max_chars}; shorten it, or raise data.max_question_chars "
                           "(its prompts must still fit the model's context)")


def _answers_problem(ex: QAExample) -> str | None:
    """What is wrong with ``ex``'s question or gold answers (an answer must keep a word after EM/F1 normalisation,
    or no prediction could ever score), or None."""
    if not ex.question:
        return "field 'question' is empty; write the question"
    if not ex.answers:
        return "field 'answers' is an empty list; give at least one gold answer"
    for i, a in enumerate(ex.answers):
        if not isinstance(a, str) or not a.strip():
            got = "empty" if isinstance(a, str) else type(a).__name__
            return f"answers[{i}] is {got}, expected a non-empty string"
        if not normalize_answer(a):
            return (f"answers[{i}] {a[:40]!r} is only punctuation and articles (a, an, the), which EM and F1 remove, "
                    "so no answer could ever match it; write the answer's words, or drop it")
    return None


def load_qa_jsonl(path: str | Path, max_question_chars: int = MAX_QUESTION_CHARS) -> list[QAExample]:
    """A unified-schema QA file: one ``{id, question, answers, supporting_titles?, source?}`` per line (or a JSON
    list of them in a ``.json`` file), each checked by :func:`check_question`."""
    path = Path(path).expanduser()
    problem = not_a_file(path)
    if problem:
        raise DatasetError(f"QA file {path} {problem}; pass a dataset name ({', '.join(DATASETS)}) or the path "
                           "of a unified-schema .jsonl file")
    if ".jsonl" in path.name:
        rows, unit = _jsonl_rows(path, _read_text(path)), "line"
    else:
        rows, unit = list(enumerate(records(path), start=1)), "record"
    out: list[QAExample] = []
    seen: dict[str, int] = {}
    for n, r in rows:
        where = f"QA file {path} {unit} {n}"
        ex = QAExample(
            id=field_of(r, "id", str, path, n, unit), question=field_of(r, "question", str, path, n, unit).strip(),
            answers=field_of(r, "answers", list, path, n, unit), supporting_titles=r.get("supporting_titles", []),
            source=r.get("source", ""),
        )
        problem = _answers_problem(ex)
        if problem:
            raise DatasetError(f"{where}: {problem}")
        if not isinstance(ex.supporting_titles, list) or not all(isinstance(t, str) for t in ex.supporting_titles):
            raise DatasetError(f"{where}: supporting_titles must be a list of strings")
        if not isinstance(ex.source, str):
            raise DatasetError(f"{where}: source must be a string")
        check_question(ex, where, max_question_chars)
        if ex.id in seen:
            raise DatasetError(f"QA file {path}: duplicate id {ex.id!r} on {unit}s {seen[ex.id]} and {n}")
        seen[ex.id] = n
        out.append(ex)
    if not out:
        raise DatasetError(f"QA file {path} holds no questions")
    return out


def write_qa_jsonl(examples: Iterable[QAExample], path: str | Path) -> Path:
    """Write examples in the unified schema (one JSON object per line), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": e.id, "question": e.question, "answers": e.answers,
                         "supporting_titles": e.supporting_titles, "source": e.source}, ensure_ascii=False)
             for e in examples]
    return atomic_write_text(path, "\n".join(lines) + "\n")


# ---------------------------------------------------------------- public entry points


def _is_path(name: str) -> bool:
    return name.endswith((".jsonl", ".jsonl.gz")) or os.sep in name or Path(name).expanduser().exists()


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; use one of {', '.join(DATASETS)} or a path to a "
                           "unified-schema .jsonl file")
    return DATASETS[name]


def _load_all(name: str, shared_dir: SharedDir, max_question_chars: int) -> list[QAExample]:
    if name not in DATASETS and _is_path(name):
        return load_qa_jsonl(name, max_question_chars)
    spec = _spec(name)
    if spec.questions is None:
        raise DatasetError(f"{name!r} is a corpus only (no questions); use corpus_for({name!r})")
    examples = spec.questions(shared_dir)
    for ex in examples:
        check_question(ex, f"dataset {name!r}", max_question_chars)
    return examples


def load_dataset(name: str, shared_dir: str | Path | None = None, limit: int | None = None, seed: int = 0,
                 max_question_chars: int = MAX_QUESTION_CHARS) -> list[QAExample]:
    """Questions of dataset ``name`` (see module doc), every one checked by :func:`check_question` (all of them,
    whatever the subset); ``limit`` keeps a seeded random subset, in order."""
    examples = _load_all(name, shared_dir, max_question_chars)
    if limit is None or limit >= len(examples):
        return examples
    if limit < 1:
        raise DatasetError(f"limit must be >= 1 (or None for all), got {limit}")
    keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


def load_questions(data: DataConfig) -> list[QAExample]:
    """The questions the config's ``data`` section names (:func:`load_dataset` with its fields)."""
    return load_dataset(data.dataset, data.shared_dir, data.limit, data.seed, data.max_question_chars)


def corpus_for(name: str, shared_dir: SharedDir = None, cache_dir: SharedDir = None) -> Path:
    """Path of the JSONL corpus that goes with dataset ``name`` (materialising a built one on first use)."""
    if name not in DATASETS and _is_path(name):
        qa = Path(name).expanduser()
        for cand in ("corpus.jsonl", "corpus.jsonl.gz"):
            if (qa.parent / cand).exists():  # a FIFO or a directory there: the corpus reader names what it is
                return qa.parent / cand
        raise DatasetError(f"no corpus.jsonl or corpus.jsonl.gz next to {qa}; set retriever.corpus to its corpus")
    spec = _spec(name)
    if spec.open_domain:
        log.warning("%s is open-domain: its questions are not aligned with the corpus it is given", name)
    if isinstance(spec.corpus, str):
        return corpus_for(spec.corpus, shared_dir, cache_dir)
    return spec.corpus(shared_dir, cache_dir)


def corpus_source(name: str) -> Path | str:
    """Which corpus dataset ``name`` is played on, found without building one: its file (a QA file's neighbour, a
    corpus that needs no shared data, as the shipped ones), else the name of the dataset whose corpus
    :func:`corpus_for` builds from shared files."""
    if name not in DATASETS and _is_path(name):
        return corpus_for(name).resolve()
    spec = _spec(name)
    if isinstance(spec.corpus, str):
        return corpus_source(spec.corpus)
    return spec.corpus(None, None).resolve() if not spec.files else name


def retriever_config_for(cfg: ZipRLConfig) -> RetrieverConfig:
    """The retriever for the configured dataset: the shipped sample index, or the pooled corpus's index."""
    r = cfg.retriever
    if cfg.data.dataset == "sample" or r.corpus or r.index_dir:
        return r
    return dataclasses.replace(r, corpus=str(corpus_for(cfg.data.dataset, cfg.data.shared_dir)))
