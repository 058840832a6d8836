"""The one corpus format: JSONL (optionally gzipped), one passage per line.

Each line is ``{"id": str, "title": str, "text": str, "url": str (optional)}``. :func:`load_corpus`
validates the whole file before anything else uses it; every problem raises :class:`CorpusError` naming
the line and what to fix. :func:`iter_corpus` and :func:`scan_corpus` stream a file of any size (a
21M-passage wiki-18 dump) with memory bounded by one line plus 16 bytes per passage.
Passage text may be any Unicode: a lone surrogate (JSON ``"\\ud800"``, not a character) is read as U+FFFD, with
one warning per file, so that the passage can be encoded, stored and shown. An id must be what the agent sees and
writes back (:func:`id_problem`): no lone surrogate, whitespace only as single spaces between words, no ``[``, ``]``
or hit marker, at most :data:`MAX_ID_CHARS` characters. A UTF-8 byte order mark opening the file is skipped.
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
MAX_ID_CHARS = 200  # an id longer than this would be cut where it is shown (the open tool's label)
ID_FORBIDDEN = re.compile("[\\[\\]\u2023]")  # '[' and ']' delimit the id in a hit line; '‣' opens one


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


def id_problem(doc_id: str) -> str | None:
    """Why the agent could not address passage id ``doc_id`` (it sees ids in ``[id]`` hit lines, each whitespace run
    shown as one space, and writes them back in ``<open>``), or None when it can."""
    found = LONE_SURROGATE.search(doc_id)
    if found:
        return (f"holds a lone surrogate (U+{ord(found[0]):04X} at character {found.start()}), which is not a "
                "character; ids must be exact, so fix the id (a JSON \\udXXX escape must be half of a pair)")
    if doc_id != " ".join(doc_id.split()):
        return ("has whitespace other than single spaces between words (leading, trailing or repeated, a tab, a "
                "line break); the agent sees each whitespace run as one space, so write the id that way")
    found = ID_FORBIDDEN.search(doc_id)
    if found:
        return (f"holds {found[0]!r}, which a search result uses to mark the id ([id] title); remove it from the id "
                "(e.g. replace brackets by parentheses)")
    if len(doc_id) > MAX_ID_CHARS:
        return f"is {len(doc_id)} characters, more than {MAX_ID_CHARS}; use shorter ids (e.g. number the passages)"
    return None


def _replace_surrogates(rec: dict) -> list[str]:
    """Replace every lone surrogate of ``rec``'s string values but its id by U+FFFD, in place; the names of those it
    changed."""
    fixed = [name for name, value in rec.items()
             if name != "id" and isinstance(value, str) and LONE_SURROGATE.search(value)]
    for name in fixed:
        rec[name] = LONE_SURROGATE.sub("\ufffd", rec[name])
    return fixed


def iter_corpus(path: str | Path) -> Iterator[tuple[int, Passage]]:
    """Stream ``(line number, passage)`` from a JSONL(.gz) corpus, validating each line (not id uniqueness); lone
    surrogates become U+FFFD (ids must be exact: one there is refused, as any id the agent cannot address)."""
    p = _existing(path)
    seen = warned = False  # a passage line was read; lone surrogates were reported
    for n, raw in enumerate(_read_lines(p), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(
                f"corpus {p} line {n}: not valid UTF-8 ({exc.reason} at byte {exc.start}); re-encode the file as UTF-8"
            ) from None
        if n == 1:
            line = line.removeprefix("\ufeff")  # a byte order mark (an editor's UTF-8 with BOM)
        if not line.strip():
            continue
        if not seen and line.lstrip().startswith("["):
            raise CorpusError(json_array_hint(p))
        seen = True
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"corpus {p} line {n}: malformed JSON ({exc.msg}); each line must be one JSON object") from None
        except RecursionError:
            raise CorpusError(f"corpus {p} line {n}: JSON nested too deeply; each line must be one JSON object "
                              f"with fields {REQUIRED_FIELDS}") from None
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
        problem = id_problem(rec["id"])
        if problem:
            raise CorpusError(f"corpus {p} line {n}: id {rec['id'][:80]!r} {problem}")
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


_last_scan: dict[tuple, CorpusScan] = {}  # the last file scanned, by identity and change time: checked once a run


def scan_corpus(path: str | Path, progress: bool | None = False) -> CorpusScan:
    """Validate a corpus of any size in one streaming pass (ids unique included); raise CorpusError naming the line.
    The same unchanged file (path, inode, size, modification time) scanned again in this process is not read again
    (a command checks its inputs, then builds the index); ``progress`` None: a bar when stderr is a terminal."""
    p = _existing(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _last_scan:
        return _last_scan[key]
    scan = _scan(p, progress)
    _last_scan.clear()
    _last_scan[key] = scan
    return scan


def _scan(p: Path, progress: bool | None) -> CorpusScan:
    h, hashes, lines = hashlib.sha256(), array("Q"), array("q")
    with tqdm(desc="checking corpus", unit=" passages", disable=None if progress is None else not progress) as bar:
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
