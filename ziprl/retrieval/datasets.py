"""QA datasets in one schema (:class:`QAExample`) and the corpora that go with them.

Names for :func:`load_dataset` and :func:`corpus_for`:

- ``sample``: the small real sample shipped in ``ziprl/data/sample`` (needs nothing else).
- ``hotpotqa``: HotpotQA questions whose paragraphs are in the pooled corpus (100 train from HippoRAG with
  supporting titles, then the first 300 dev questions of the distractor setting, which have none).
- ``musique``: 100 MuSiQue-Ans train questions (HippoRAG subset) with supporting titles.
- ``pooled``: hotpotqa + musique (500 questions); all are retrieved against the pooled corpus.
- ``hotpotqa-dev`` (7,405), ``musique-dev`` (2,417), ``squad`` (10,570): open-domain question/answer
  sets whose paragraphs are not available; :func:`corpus_for` gives them the pooled corpus and warns.
- ``wiki18``: corpus only (1,000 FlashRAG wiki18 passages).
- a path to a unified-schema ``.jsonl``: its corpus is ``corpus.jsonl[.gz]`` next to it.

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
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError
from ziprl.config import RetrieverConfig, ZipRLConfig
from ziprl.paths import cache_root
from ziprl.retrieval.corpus import write_corpus
from ziprl.retrieval.types import Passage, QAExample

log = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "sample"
SHARED_ENV = "ZIPRL_SHARED_DATA"
POOLED_VERSION = "pooled-v1"  # bump when the pooled-corpus construction changes

FILES = {
    "hotpot_train": "hotpotqa/hipporag_hotpotqa_train_subset100.json.gz",
    "hotpot_train_corpus": "hotpotqa/hipporag_hotpotqa_train_subset100_corpus.json.gz",
    "hotpot_distractor": "hotpotqa/hotpot_dev_distractor_first300_documents.json.gz",
    "hotpot_dev": "hotpotqa/hotpot_dev_qa.json.gz",
    "musique_train": "musique/hipporag_musique_train_subset100.json.gz",
    "musique_train_corpus": "musique/hipporag_musique_train_subset100_corpus.json.gz",
    "musique_dev": "musique/musique_ans_v1.0_dev.no_paragraphs.json.gz",
    "squad_dev": "squad/squad_v1.1_dev_qa.jsonl.gz",
    "wiki18": "wiki18_passages_sample/flashrag_wiki18_sample_1000.jsonl.gz",
}
POOLED_SOURCES = ("hotpot_train_corpus", "musique_train_corpus", "hotpot_distractor", "wiki18")
OPEN_DOMAIN = ("hotpotqa-dev", "musique-dev", "squad")
NAMES = ("sample", "hotpotqa", "musique", "pooled", *OPEN_DOMAIN)


class DatasetError(UserError, ValueError):
    """A dataset is unknown, missing or malformed; the message says which file and how to fix it."""


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


def shared_file(key: str, shared_dir: str | Path | None = None) -> Path:
    """Path of one of the :data:`FILES` under the shared data dir; DatasetError when it is missing."""
    root = Path(shared_dir).expanduser() if shared_dir is not None else default_shared_dir()
    path = root / FILES[key]
    if not path.is_file():
        raise DatasetError(f"dataset file {path} is missing; expected {FILES[key]} under the shared data dir {root}")
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


def _records(path: Path, container: type = list) -> Any:
    data = _read_json(path)
    if not isinstance(data, container):
        raise DatasetError(f"dataset file {path}: expected a JSON {container.__name__}, got {type(data).__name__}")
    return data


def _get(rec: Any, key: str, tp: type | tuple[type, ...], path: Path, n: int) -> Any:
    """``rec[key]`` checked against ``tp``; DatasetError naming file, record and field otherwise."""
    if not isinstance(rec, dict) or key not in rec or not isinstance(rec[key], tp):
        got = "missing" if not isinstance(rec, dict) or key not in rec else type(rec[key]).__name__
        want = tp.__name__ if isinstance(tp, type) else "/".join(t.__name__ for t in tp)
        raise DatasetError(f"dataset file {path} record {n}: field {key!r} is {got}, expected {want}; is this the right file?")
    return rec[key]


def _clean(s: str) -> str:
    return " ".join(s.split())


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# ---------------------------------------------------------------- HotpotQA


def load_hotpot_train(path: str | Path) -> list[QAExample]:
    """HippoRAG HotpotQA train subset (official schema); supporting titles from ``supporting_facts``."""
    path = Path(path)
    out = []
    for n, r in enumerate(_records(path)):
        facts = _get(r, "supporting_facts", list, path, n)
        out.append(QAExample(
            id=_get(r, "_id", str, path, n), question=_get(r, "question", str, path, n).strip(),
            answers=[_get(r, "answer", str, path, n)], supporting_titles=_unique(str(f[0]) for f in facts),
            source="hotpotqa-train",
        ))
    return out


def hotpot_train_paragraphs(path: str | Path) -> list[tuple[str, str]]:
    """(title, text) pairs of the HippoRAG HotpotQA corpus file (``{title: [sentences]}``)."""
    path = Path(path)
    out = []
    for n, (title, sentences) in enumerate(_records(path, dict).items()):
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
    for n, r in enumerate(_records(path)):
        answers = _get(r, "answers", list, path, n)
        out.append(QAExample(
            id=f"hotpotqa-dev-distractor-{_get(r, 'id', int, path, n)}", question=_get(r, "question", str, path, n).strip(),
            answers=[str(a) for a in answers], source="hotpotqa-dev-distractor",
        ))
    return out


def hotpot_distractor_paragraphs(path: str | Path) -> dict[int, list[tuple[str, str]]]:
    """Question id -> its context paragraphs as (title, text), from the distractor file's ``document``."""
    path = Path(path)
    out = {}
    for n, r in enumerate(_records(path)):
        doc = _get(r, "document", str, path, n)
        out[_get(r, "id", int, path, n)] = [split_title(p.strip()) for p in doc.split("\n\n") if p.strip()]
    return out


def load_hotpot_dev(path: str | Path) -> list[QAExample]:
    """All 7,405 HotpotQA dev questions, question + answer only (open-domain)."""
    path = Path(path)
    return [QAExample(id=f"hotpotqa-dev-{n}", question=_get(r, "question", str, path, n).strip(),
                      answers=[_get(r, "answer", str, path, n)], source="hotpotqa-dev")
            for n, r in enumerate(_records(path))]


# ---------------------------------------------------------------- MuSiQue, SQuAD, wiki18


def _musique_answers(r: Any, path: Path, n: int) -> list[str]:
    return _unique([_get(r, "answer", str, path, n), *map(str, _get(r, "answer_aliases", list, path, n))])


def load_musique_train(path: str | Path) -> list[QAExample]:
    """HippoRAG MuSiQue-Ans train subset; answers = answer + aliases, titles of ``is_supporting`` paragraphs."""
    path = Path(path)
    out = []
    for n, r in enumerate(_records(path)):
        paragraphs = _get(r, "paragraphs", list, path, n)
        out.append(QAExample(
            id=_get(r, "id", str, path, n), question=_get(r, "question", str, path, n).strip(),
            answers=_musique_answers(r, path, n),
            supporting_titles=_unique(_get(p, "title", str, path, n) for p in paragraphs if p.get("is_supporting")),
            source="musique-train",
        ))
    return out


def musique_train_paragraphs(path: str | Path) -> list[tuple[str, str]]:
    """(title, text) of the HippoRAG MuSiQue corpus file (``[{title, text}]``)."""
    path = Path(path)
    return [(_get(r, "title", str, path, n), _get(r, "text", str, path, n)) for n, r in enumerate(_records(path))]


def load_musique_dev(path: str | Path) -> list[QAExample]:
    """All 2,417 MuSiQue-Ans dev questions without paragraphs (open-domain)."""
    path = Path(path)
    return [QAExample(id=_get(r, "id", str, path, n), question=_get(r, "question", str, path, n).strip(),
                      answers=_musique_answers(r, path, n), source="musique-dev")
            for n, r in enumerate(_records(path))]


def load_squad_dev(path: str | Path) -> list[QAExample]:
    """All 10,570 SQuAD v1.1 dev questions with their distinct gold answers (no contexts)."""
    path = Path(path)
    return [QAExample(id=f"squad-dev-{n}", question=_get(r, "question", str, path, n).strip(),
                      answers=[str(a) for a in _get(r, "answer", list, path, n)], source="squad-dev")
            for n, r in enumerate(_records(path))]


def wiki18_passages(path: str | Path) -> list[Passage]:
    """FlashRAG wiki18 passages (``contents = '"<title>"\\n<text>'``); ids ``wiki18-<id>``."""
    path = Path(path)
    out = []
    for n, r in enumerate(_records(path)):
        doc_id, contents = _get(r, "id", str, path, n), _get(r, "contents", str, path, n)
        title, _, text = contents.partition("\n")
        if len(title) > 1 and title[0] == title[-1] == '"':
            title = title[1:-1]
        out.append(Passage(doc_id=f"wiki18-{doc_id}", title=_clean(title), text=_clean(text)))
    return out


# ---------------------------------------------------------------- the pooled corpus


def pooled_passages(shared_dir: str | Path | None = None) -> list[Passage]:
    """Every paragraph of the pooled sets, whitespace-normalised, de-duplicated on (title, text)."""
    f = {k: shared_file(k, shared_dir) for k in POOLED_SOURCES}
    rows: list[tuple[str, str, str]] = []
    rows += [(f"hotpot-train-{i}", t, x) for i, (t, x) in enumerate(hotpot_train_paragraphs(f["hotpot_train_corpus"]))]
    rows += [(f"musique-train-{i}", t, x) for i, (t, x) in enumerate(musique_train_paragraphs(f["musique_train_corpus"]))]
    rows += [(f"hotpot-dev-{q}-{j}", t, x) for q, pars in hotpot_distractor_paragraphs(f["hotpot_distractor"]).items()
             for j, (t, x) in enumerate(pars)]
    rows += [(p.doc_id, p.title, p.text) for p in wiki18_passages(f["wiki18"])]
    seen: set[tuple[str, str]] = set()
    out = []
    for doc_id, title, text in rows:
        key = (_clean(title), _clean(text))
        if key[0] and key[1] and key not in seen:
            seen.add(key)
            out.append(Passage(doc_id=doc_id, title=key[0], text=key[1]))
    return out


def context_paragraphs(shared_dir: str | Path | None = None) -> dict[str, list[tuple[str, str]]]:
    """Pooled question id -> its context paragraphs as (title, text), normalised as in the pooled corpus."""
    out: dict[str, list[tuple[str, str]]] = {}
    path = shared_file("hotpot_train", shared_dir)
    for n, r in enumerate(_records(path)):
        context = _get(r, "context", list, path, n)
        out[_get(r, "_id", str, path, n)] = [(_clean(t), _clean("".join(s))) for t, s in context]
    path = shared_file("musique_train", shared_dir)
    for n, r in enumerate(_records(path)):
        paragraphs = _get(r, "paragraphs", list, path, n)
        out[_get(r, "id", str, path, n)] = [(_clean(p["title"]), _clean(p["paragraph_text"])) for p in paragraphs]
    for q, pars in hotpot_distractor_paragraphs(shared_file("hotpot_distractor", shared_dir)).items():
        out[f"hotpotqa-dev-distractor-{q}"] = [(_clean(t), _clean(x)) for t, x in pars]
    return out


def _files_hash(paths: Iterable[Path], salt: str) -> str:
    h = hashlib.sha256(salt.encode())
    for p in paths:
        h.update(p.name.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def _materialise(name: str, keys: tuple[str, ...], build: Any, shared_dir: str | Path | None,
                 cache_dir: str | Path | None) -> Path:
    paths = [shared_file(k, shared_dir) for k in keys]
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
        raise DatasetError(f"QA file {path} does not exist; pass a dataset name ({', '.join(NAMES)}) or the path "
                           "of a unified-schema .jsonl file")
    out: list[QAExample] = []
    seen: dict[str, int] = {}
    for n, r in enumerate(_records(path), start=1):
        ex = QAExample(
            id=_get(r, "id", str, path, n), question=_get(r, "question", str, path, n).strip(),
            answers=_get(r, "answers", list, path, n), supporting_titles=r.get("supporting_titles", []),
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


def _load_all(name: str, shared_dir: str | Path | None) -> list[QAExample]:
    if name == "sample":
        return load_qa_jsonl(_sample_file("qa.jsonl"))
    if name == "hotpotqa":
        return (load_hotpot_train(shared_file("hotpot_train", shared_dir))
                + load_hotpot_distractor(shared_file("hotpot_distractor", shared_dir)))
    if name == "musique":
        return load_musique_train(shared_file("musique_train", shared_dir))
    if name == "pooled":
        return _load_all("hotpotqa", shared_dir) + _load_all("musique", shared_dir)
    if name == "hotpotqa-dev":
        return load_hotpot_dev(shared_file("hotpot_dev", shared_dir))
    if name == "musique-dev":
        return load_musique_dev(shared_file("musique_dev", shared_dir))
    if name == "squad":
        return load_squad_dev(shared_file("squad_dev", shared_dir))
    if name == "wiki18":
        raise DatasetError("'wiki18' is a corpus only (no questions); use corpus_for('wiki18')")
    if _is_path(name):
        return load_qa_jsonl(name)
    raise DatasetError(f"unknown dataset {name!r}; use one of {NAMES} or a path to a unified-schema .jsonl file")


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


def _sample_file(name: str) -> Path:
    path = SAMPLE_DIR / name
    if not path.is_file():
        raise DatasetError(f"shipped sample file {path} is missing; reinstall ziprl or run scripts/make_sample.py")
    return path


def corpus_for(name: str, shared_dir: str | Path | None = None, cache_dir: str | Path | None = None) -> Path:
    """Path of the JSONL corpus that goes with dataset ``name`` (materialising the pooled one on first use)."""
    if name == "sample":
        return _sample_file("corpus.jsonl.gz")
    if name in OPEN_DOMAIN:
        log.warning("%s is open-domain: its questions are not aligned with the pooled corpus it is given", name)
    if name in ("hotpotqa", "musique", "pooled", *OPEN_DOMAIN):
        return _materialise("pooled", POOLED_SOURCES, lambda: pooled_passages(shared_dir), shared_dir, cache_dir)
    if name == "wiki18":
        return _materialise("wiki18", ("wiki18",), lambda: wiki18_passages(shared_file("wiki18", shared_dir)),
                            shared_dir, cache_dir)
    if _is_path(name):
        qa = Path(name).expanduser()
        for cand in ("corpus.jsonl", "corpus.jsonl.gz"):
            if (qa.parent / cand).is_file():
                return qa.parent / cand
        raise DatasetError(f"no corpus.jsonl or corpus.jsonl.gz next to {qa}; set retriever.corpus to its corpus")
    raise DatasetError(f"unknown dataset {name!r}; use one of {NAMES}, 'wiki18' or a path to a .jsonl file")


def retriever_config_for(cfg: ZipRLConfig) -> RetrieverConfig:
    """The retriever for the configured dataset: the shipped sample index, or the pooled corpus's index."""
    r = cfg.retriever
    if cfg.data.dataset == "sample" or r.corpus or r.index_dir:
        return r
    return dataclasses.replace(r, corpus=str(corpus_for(cfg.data.dataset, cfg.data.shared_dir)))
