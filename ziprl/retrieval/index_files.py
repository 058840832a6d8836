"""The on-disk layout of an index directory, its manifest, and the retriever's errors.

Format 2: ``manifest.json`` (written last) and, for one shard, ``index.faiss`` + the passage store
(:mod:`ziprl.retrieval.passage_store`) in the directory itself; for N > 1 shards the same files in
``shard-000`` .. ``shard-<N-1>``, each holding a contiguous range of the corpus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError
from ziprl.retrieval.passage_store import STORE_FILES

INDEX_FILE, MANIFEST_FILE, VECTORS_FILE = "index.faiss", "manifest.json", "vectors.npy"
FORMAT_VERSION = 2
PART_FILES = (INDEX_FILE, *STORE_FILES)


class RetrieverError(UserError, ValueError):
    """Bad retriever input, or an index/encoder that cannot be used; the message says how to fix it."""


class UnknownDocument(UserError, KeyError):
    """``open`` was given an id that is not in the index."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown document id"


def shard_dir(index_dir: Path, shard: int, shards: int) -> Path:
    """Directory holding shard ``shard`` of an index with ``shards`` shards."""
    return index_dir if shards == 1 else index_dir / f"shard-{shard:03d}"


def shard_bounds(count: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` row ranges of each shard (sizes differ by at most one)."""
    cuts = [count * i // shards for i in range(shards + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_manifest(index_dir: Path) -> dict[str, Any] | None:
    return read_json(index_dir / MANIFEST_FILE)


def missing_files(index_dir: Path, manifest: dict[str, Any] | None) -> list[str]:
    """Files an index directory lacks (relative names); the manifest says how many shards to expect (a manifest whose
    count of shards is not a whole number >= 1 is damaged: it is named as lacking)."""
    shards = (manifest or {}).get("shards", 1)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        return [MANIFEST_FILE]
    files = PART_FILES + ((VECTORS_FILE,) if (manifest or {}).get("store_vectors") else ())
    names = [MANIFEST_FILE] + [str(shard_dir(Path(), s, shards) / f) for s in range(shards) for f in files]
    return [n for n in names if not (index_dir / n).is_file()]
