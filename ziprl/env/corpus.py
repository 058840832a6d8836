"""The one corpus format: JSONL (optionally gzipped), one passage per line.

Each line is ``{"id": str, "title": str, "text": str, "url": str (optional)}``. :func:`load_corpus`
validates the whole file before anything else uses it; every problem raises :class:`CorpusError` naming
the line and what to fix.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from ziprl.env.types import Passage

REQUIRED_FIELDS = ("id", "title", "text")


class CorpusError(ValueError):
    """A corpus file is missing or malformed; the message says where and how to fix it."""


def cache_root() -> Path:
    """ZipRL's cache directory: ``$ZIPRL_CACHE_DIR`` or ``~/.cache/ziprl``."""
    return Path(os.environ.get("ZIPRL_CACHE_DIR") or "~/.cache/ziprl").expanduser()


def _read_lines(path: Path) -> list[bytes]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read().splitlines()
    except (OSError, EOFError) as exc:
        raise CorpusError(f"corpus {path}: cannot be read ({exc}); is it a valid .jsonl or .jsonl.gz file?") from None


def load_corpus(path: str | Path) -> list[Passage]:
    """Read and validate a JSONL(.gz) corpus; raise CorpusError on the first problem found."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise CorpusError(f"corpus file {p} does not exist; pass the path of a .jsonl or .jsonl.gz corpus")
    passages: list[Passage] = []
    first_line: dict[str, int] = {}
    for n, raw in enumerate(_read_lines(p), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(
                f"corpus {p} line {n}: not valid UTF-8 ({exc.reason} at byte {exc.start}); re-encode the file as UTF-8"
            ) from None
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"corpus {p} line {n}: malformed JSON ({exc.msg}); each line must be one JSON object") from None
        if not isinstance(rec, dict):
            raise CorpusError(f"corpus {p} line {n}: expected a JSON object with fields {REQUIRED_FIELDS}")
        for name in REQUIRED_FIELDS:
            value = rec.get(name)
            if not isinstance(value, str) or not value.strip():
                problem = "missing" if name not in rec else "empty" if isinstance(value, str) else "not a string"
                raise CorpusError(f"corpus {p} line {n}: field {name!r} is {problem}; every passage needs a non-empty string {name!r}")
        url = rec.get("url") or ""
        if not isinstance(url, str):
            raise CorpusError(f"corpus {p} line {n}: field 'url' must be a string when present")
        doc_id = rec["id"]
        if doc_id in first_line:
            raise CorpusError(
                f"corpus {p}: duplicate id {doc_id!r} on lines {first_line[doc_id]} and {n}; ids must be unique"
            )
        first_line[doc_id] = n
        passages.append(Passage(doc_id=doc_id, title=rec["title"], text=rec["text"], url=url))
    if not passages:
        raise CorpusError(f"corpus {p} is empty; it needs at least one passage line")
    return passages


def _record(p: Passage) -> dict[str, str]:
    rec = {"id": p.doc_id, "title": p.title, "text": p.text}
    if p.url:
        rec["url"] = p.url
    return rec


def corpus_sha256(passages: Iterable[Passage]) -> str:
    """Content hash of passages (independent of compression and JSON formatting)."""
    h = hashlib.sha256()
    for p in passages:
        h.update(json.dumps([p.doc_id, p.title, p.text, p.url], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def write_corpus(passages: Iterable[Passage], path: str | Path) -> Path:
    """Write passages as JSONL (gzipped, reproducibly, when the name ends in ``.gz``); atomic."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(_record(x), ensure_ascii=False) + "\n" for x in passages).encode("utf-8")
    if p.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p
