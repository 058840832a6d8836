"""Passages on disk, memory-mapped: an Arrow IPC file plus a sorted id-hash index (numpy, memory-mapped).

``passages.arrow`` holds record batches of ``batch_rows`` rows (id, title, text, url); row ``r`` is in
batch ``r // batch_rows``, read zero-copy from the mapped file, so only the pages of passages actually
returned become resident. ``id_hash.npy`` (sorted uint64 hashes of ids) and ``id_row.npy`` (their
rows) map an id to its row by binary search: 16 bytes per passage on disk, none of it loaded eagerly.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from ziprl.retrieval.corpus import id_hash
from ziprl.retrieval.types import Passage

PASSAGES_FILE, ID_HASH_FILE, ID_ROW_FILE = "passages.arrow", "id_hash.npy", "id_row.npy"
STORE_FILES = (PASSAGES_FILE, ID_HASH_FILE, ID_ROW_FILE)
BATCH_ROWS = 4096
SCHEMA = pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("url", pa.string())])


def passage_text(p: Passage) -> str:
    """What is embedded for a passage: its title, a newline, its text."""
    return f"{p.title}\n{p.text}"


def write_store(passages: Iterable[Passage], out_dir: Path, id_hashes: np.ndarray, batch_rows: int = BATCH_ROWS) -> int:
    """Stream passages into ``out_dir``'s store files (memory: one batch); returns the row count.

    ``id_hashes`` are :func:`ziprl.retrieval.corpus.id_hash` of the ids in the same order (from ``scan_corpus``).
    """
    rows = 0
    cols: list[list[str]] = [[], [], [], []]

    def flush(writer: pa.ipc.RecordBatchFileWriter) -> None:
        writer.write_batch(pa.record_batch([pa.array(c, pa.string()) for c in cols], schema=SCHEMA))
        for c in cols:
            c.clear()

    with pa.OSFile(str(out_dir / PASSAGES_FILE), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        for p in passages:
            for c, v in zip(cols, (p.doc_id, p.title, p.text, p.url), strict=True):
                c.append(v)
            rows += 1
            if len(cols[0]) == batch_rows:
                flush(writer)
        if cols[0]:
            flush(writer)
    if rows != len(id_hashes):
        raise ValueError(f"wrote {rows} passages but got {len(id_hashes)} id hashes")
    order = np.argsort(id_hashes, kind="stable")
    np.save(out_dir / ID_HASH_FILE, id_hashes[order])
    np.save(out_dir / ID_ROW_FILE, order.astype(np.int64))
    return rows


class DamagedStore(ValueError):
    """A store file holds values no build writes (the retriever adds how to rebuild the index)."""


class PassageStore:
    """Read-only, memory-mapped passages of one index (or shard) directory."""

    def __init__(self, directory: str | Path):
        d = Path(directory)
        self._reader = pa.ipc.open_file(pa.memory_map(str(d / PASSAGES_FILE), "r"))
        if self._reader.schema.names != SCHEMA.names:
            raise ValueError(f"{d / PASSAGES_FILE} has columns {self._reader.schema.names}, expected {SCHEMA.names}")
        self._hashes = np.load(d / ID_HASH_FILE, mmap_mode="r")
        self._rows = np.load(d / ID_ROW_FILE, mmap_mode="r")
        n = self._reader.num_record_batches
        self.batch_rows = self._reader.get_batch(0).num_rows if n else 0
        self._len = (n - 1) * self.batch_rows + self._reader.get_batch(n - 1).num_rows if n else 0
        if self._hashes.ndim != 1 or self._rows.ndim != 1 or not np.issubdtype(self._rows.dtype, np.integer):
            raise ValueError(f"{d}: {ID_HASH_FILE} and {ID_ROW_FILE} must be 1-D (integer rows), got "
                             f"{self._hashes.shape} and {self._rows.shape} of {self._rows.dtype}")
        if not len(self._hashes) == len(self._rows) == self._len:
            raise ValueError(f"{d}: {self._len} passages but {len(self._hashes)} id hashes / {len(self._rows)} rows")
        self._dir = d

    def __len__(self) -> int:
        return self._len

    def _cell(self, row: int, col: int) -> str:
        return self._reader.get_batch(row // self.batch_rows).column(col)[row % self.batch_rows].as_py()

    def doc_id(self, row: int) -> str:
        return self._cell(row, 0)

    def passage(self, row: int) -> Passage:
        """The passage at ``row`` (0-based, corpus order)."""
        batch = self._reader.get_batch(row // self.batch_rows)
        i = row % self.batch_rows
        return Passage(*(batch.column(c)[i].as_py() for c in range(4)))

    def head(self, row: int, chars: int) -> tuple[str, str, str, str]:
        """(id, title, first ``chars`` characters of text, url) of ``row``, for a search hit."""
        batch = self._reader.get_batch(row // self.batch_rows)
        i = row % self.batch_rows
        return (batch.column(0)[i].as_py(), batch.column(1)[i].as_py(), batch.column(2)[i].as_py()[:chars],
                batch.column(3)[i].as_py())

    def row_of(self, doc_id: str) -> int | None:
        """Row of the passage with this id, or None."""
        h = np.uint64(id_hash(doc_id))
        i = int(np.searchsorted(self._hashes, h))
        while i < len(self._hashes) and self._hashes[i] == h:
            row = int(self._rows[i])
            if not 0 <= row < self._len:  # checked here, not at load: that would read the whole file
                raise DamagedStore(f"{self._dir / ID_ROW_FILE} is damaged (row {row} is outside 0..{self._len - 1})")
            if self.doc_id(row) == doc_id:
                return row
            i += 1
        return None

    def texts(self, start: int, stop: int) -> list[str]:
        """``title\\ntext`` of rows ``start..stop-1`` (what is embedded for a passage)."""
        out: list[str] = []
        row = start
        while row < stop:
            batch = self._reader.get_batch(row // self.batch_rows)
            i = row % self.batch_rows
            j = min(batch.num_rows, i + stop - row)
            titles, texts = batch.column(1)[i:j].to_pylist(), batch.column(2)[i:j].to_pylist()
            out.extend(passage_text(Passage("", a, b)) for a, b in zip(titles, texts, strict=True))
            row += j - i
        return out
