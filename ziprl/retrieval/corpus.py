"""The one corpus format: JSONL (optionally gzipped), one passage per line.

Each line is ``{"id": str, "title": str, "text": str, "url": str (optional)}``. :func:`load_corpus`
validates the whole file before anything else uses it; every problem raises :class:`CorpusError` naming
the line and what to fix. :func:`iter_corpus` and :func:`scan_corpus` stream a file of any size (a
21M-passage wiki-18 dump) with memory bounded by one line plus 16 bytes per passage.
Passage text may be any Unicode: a lone surrogate (JSON ``"\\ud800"``, not a character) is read as U+FFFD, with
one warning per file, so that the passage can be encoded, stored and shown.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import shlex
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ziprl.boundary import UserError
from ziprl.paths import atomic_write_bytes, not_a_file
from ziprl.retrieval.types import Passage

log = logging.getLogger(__name__)

REQUIRED_FIELDS = ("id", "title", "text")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a str from JSON holds one only where the text had a lone "\udXXX"


class CorpusError(UserError, ValueError):
    """A corpus file is missing or malformed; the message says where and how to fix it."""


def _read_lines(path: Path) -> Iterator[bytes]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            yield from f
    except (OSError, EOFError) as exc:
        raise CorpusError(f"corpus {path}: cannot be read ({exc}); is it a valid .jsonl or .jsonl.gz file?") from None


def _existing(path: str | Path) -> Path:
    p = Path(path).expanduser()
    problem = not_a_file(p)
    if problem:
        raise CorpusError(f"corpus file {p} {problem}; pass the path of a .jsonl or .jsonl.gz corpus")
    return p


def json_array_hint(path: Path) -> str:
    """The message for a JSON array given where JSONL belongs, with the command that converts it."""
    gz = path.name.endswith(".gz")
    stem = path.name.removesuffix(".gz").removesuffix(".jsonl").removesuffix(".json")
    load = 'json.load(gzip.open(sys.argv[1], "rt"))' if gz else "json.load(open(sys.argv[1]))"
    script = f"import {'gzip, ' if gz else ''}json, sys; [print(json.dumps(r)) for r in {load}]"
    return (f"{path} is a JSON array, not JSONL (one JSON object per line); convert it with: python -c "
            f"{shlex.quote(script)} {shlex.quote(str(path))} > {shlex.quote(str(path.with_name(stem + '.lines.jsonl')))}")


def _replace_surrogates(rec: dict) -> list[str]:
    """Replace every lone surrogate of ``rec``'s string values by U+FFFD, in place; the names of those it changed."""
    fixed = [name for name, value in rec.items() if isinstance(value, str) and LONE_SURROGATE.search(value)]
    for name in fixed:
        rec[name] = LONE_SURROGATE.sub("\ufffd", rec[name])
    return fixed


def iter_corpus(path: str | Path) -> Iterator[tuple[int, Passage]]:
    """Stream ``(line number, passage)`` from a JSONL(.gz) corpus, validating each line (not id uniqueness); lone
    surrogates become U+FFFD."""
    p = _existing(path)
    seen = warned = False  # a passage line was read; lone surrogates were reported
    for n, raw in enumerate(_read_lines(p), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(
                f"corpus {p} line {n}: not valid UTF-8 ({exc.reason} at byte {exc.start}); re-encode the file as UTF-8"
            ) from None
        if not line.strip():
            continue
        if not seen and line.lstrip().startswith("["):
            raise CorpusError(json_array_hint(p))
        seen = True
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"corpus {p} line {n}: malformed JSON ({exc.msg}); each line must be one JSON object") from None
        if not isinstance(rec, dict):
            raise CorpusError(f"corpus {p} line {n}: expected a JSON object with fields {REQUIRED_FIELDS}")
        fixed = _replace_surrogates(rec)
        if fixed and not warned:
            warned = True
            log.warning("corpus %s line %d: lone surrogates (not characters) in %s are read as U+FFFD (warned once "
                        "per reading of the file)", p, n, ", ".join(fixed))
        for name in REQUIRED_FIELDS:
            value = rec.get(name)
            if not isinstance(value, str) or not value.strip():
                problem = "missing" if name not in rec else "empty" if isinstance(value, str) else "not a string"
                raise CorpusError(f"corpus {p} line {n}: field {name!r} is {problem}; every passage needs a non-empty string {name!r}")
        url = rec.get("url") or ""
        if not isinstance(url, str):
            raise CorpusError(f"corpus {p} line {n}: field 'url' must be a string when present")
        yield n, Passage(doc_id=rec["id"], title=rec["title"], text=rec["text"], url=url)


def _duplicate(path: Path, doc_id: str, first: int, n: int) -> CorpusError:
    return CorpusError(f"corpus {path}: duplicate id {doc_id!r} on lines {first} and {n}; ids must be unique")


def _empty(path: Path) -> CorpusError:
    return CorpusError(f"corpus {path} is empty; it needs at least one passage line")


def load_corpus(path: str | Path) -> list[Passage]:
    """Read and validate a JSONL(.gz) corpus into memory; raise CorpusError on the first problem found."""
    passages: list[Passage] = []
    first_line: dict[str, int] = {}
    for n, passage in iter_corpus(path):
        if passage.doc_id in first_line:
            raise _duplicate(Path(path), passage.doc_id, first_line[passage.doc_id], n)
        first_line[passage.doc_id] = n
        passages.append(passage)
    if not passages:
        raise _empty(Path(path))
    return passages


def id_hash(doc_id: str) -> int:
    """64-bit hash of a passage id (keys the on-disk id -> row index)."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass
class CorpusScan:
    """What one streaming pass over a corpus found: content hash, passage count, id hashes in row order."""

    sha256: str
    count: int
    id_hashes: np.ndarray  # uint64, one per passage, in file order


def scan_corpus(path: str | Path, progress: bool = False) -> CorpusScan:
    """Validate a corpus of any size in one streaming pass (ids unique included); raise CorpusError naming the line."""
    p = _existing(path)
    h, hashes, lines = hashlib.sha256(), array("Q"), array("q")
    with tqdm(desc="checking corpus", unit=" passages", disable=not progress) as bar:
        for n, passage in iter_corpus(p):
            h.update(_hash_line(passage))
            hashes.append(id_hash(passage.doc_id))
            lines.append(n)
            bar.update()
    if not hashes:
        raise _empty(p)
    ids = np.frombuffer(hashes, dtype=np.uint64)
    order = np.argsort(ids, kind="stable")
    same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if len(same):  # equal hashes: compare the real ids (a 64-bit collision is not a duplicate)
        suspect = {int(lines[order[i]]) for i in same} | {int(lines[order[i + 1]]) for i in same}
        seen: dict[str, int] = {}
        for n, passage in iter_corpus(p):
            if n in suspect:
                if passage.doc_id in seen:
                    raise _duplicate(p, passage.doc_id, seen[passage.doc_id], n)
                seen[passage.doc_id] = n
    return CorpusScan(h.hexdigest(), len(ids), ids.copy())


def _record(p: Passage) -> dict[str, str]:
    rec = {"id": p.doc_id, "title": p.title, "text": p.text}
    if p.url:
        rec["url"] = p.url
    return rec


def _hash_line(p: Passage) -> bytes:
    return json.dumps([p.doc_id, p.title, p.text, p.url], ensure_ascii=False).encode("utf-8") + b"\n"


def corpus_sha256(passages: Iterable[Passage]) -> str:
    """Content hash of passages (independent of compression and JSON formatting)."""
    h = hashlib.sha256()
    for p in passages:
        h.update(_hash_line(p))
    return h.hexdigest()


def write_corpus(passages: Iterable[Passage], path: str | Path) -> Path:
    """Write passages as JSONL (gzipped, reproducibly, when the name ends in ``.gz``); atomic."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(_record(x), ensure_ascii=False) + "\n" for x in passages).encode("utf-8")
    if p.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    return atomic_write_bytes(p, data)
