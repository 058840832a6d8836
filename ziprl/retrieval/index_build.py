"""Building FAISS index directories at any scale: factory strings, training on a sample, streamed
chunked adds with resumable checkpoints, shards, precomputed embeddings, adopting a prebuilt index.

Memory while building is bounded by one chunk of vectors (``chunk_size`` x dim x 4 bytes, plus the
encoder's activations when encoding), the training sample, 16 bytes per passage of id hashes, and the
index of the shard being filled. The work happens in ``.<out>.partial`` next to ``out``; ``progress.json``
there (rewritten atomically after each checkpoint) records what is done, so a build that is interrupted
resumes from its last checkpoint when run again with the same inputs, and the old index in ``out`` stays as it is.

A finished build is installed into ``out`` entry by entry (:func:`install`): ``out`` itself is never renamed or
replaced (its inode, mode and owner stay, and so does a shell's working directory). The old index's entries are
planned again first, so a file that appeared in ``out`` meanwhile stops the install (the new index waits in the work
directory for a rerun) instead of being deleted; only planned entries are deleted. The plan is recorded in
``progress.json`` before anything is deleted, so an install that is interrupted is finished by the rerun.
An existing ``out`` that is a mount point (an empty volume) is refused before anything is written: the work directory
beside it is on another file system, which no rename can cross; build into a directory inside it instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from itertools import islice
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from ziprl.boundary import UserError
from ziprl.outputs import (
    LOCK,
    MARKER,
    OutputError,
    checked_dir,
    delete,
    entries,
    locked,
    marker_leftover,
    no_marker,
    normalise,
    plan_replace,
    read_marker,
    refuse_inputs_inside,
    refuse_links,
    shown,
    used,
    write_marker,
)
from ziprl.paths import atomic_path, atomic_write_json, fsync
from ziprl.retrieval.corpus import iter_corpus, scan_corpus
from ziprl.retrieval.encoder import Encoder
from ziprl.retrieval.index_files import (
    FORMAT_VERSION,
    INDEX_FILE,
    MANIFEST_FILE,
    VECTORS_FILE,
    RetrieverError,
    missing_files,
    read_json,
    read_manifest,
    shard_bounds,
    shard_dir,
)
from ziprl.retrieval.passage_store import STORE_FILES, PassageStore, write_store

log = logging.getLogger(__name__)

ALIASES = {"flat": "Flat", "hnsw": "HNSW32"}  # the two names of the first format, as factory strings
HNSW_EF_CONSTRUCTION = 200
PROGRESS_FILE, TRAINED_FILE = "progress.json", "trained.faiss"
# manifest keys that must agree for an existing index (or a partial build) to be reused
BUILD_KEYS = ("format", "corpus_sha256", "count", "encoder", "query_prefix", "passage_prefix", "factory", "shards",
              "embeddings", "train_size", "store_vectors")
BUILD_DEFAULTS = {"store_vectors": False}  # build keys an index written before they existed is read as having
SHARD_FILES = "|".join(map(re.escape, (INDEX_FILE, VECTORS_FILE, *STORE_FILES)))  # what a shard directory holds
# what an index directory holds (its own marker and lock included), and so what --overwrite may delete: its
# top-level names and the relative paths of the files inside its shard directories
is_index_entry = entries(*map(re.escape, (MANIFEST_FILE, INDEX_FILE, VECTORS_FILE, *STORE_FILES)), r"shard-\d{3,}",
                         rf"shard-\d{{3,}}/(?:{SHARD_FILES})")
LEFTOVER = re.compile(r"index\.partial-\d+\.faiss|\..+\.[0-9a-f]{8}\.tmp")  # a killed build's files (checkpoints, temps)


def build_key(manifest: dict) -> dict:
    """The build settings a manifest (or a partial build's progress) records, old files' missing keys defaulted."""
    return {k: manifest.get(k, BUILD_DEFAULTS.get(k)) for k in BUILD_KEYS}


# ---------------------------------------------------------------- index types


def factory_string(index_type: str) -> str:
    """FAISS factory string of an index type: ``flat``/``hnsw`` or any factory string (e.g. ``IVF4096,PQ64,RFlat``)."""
    if not isinstance(index_type, str) or not index_type.strip():
        raise RetrieverError(f"index type must be 'flat', 'hnsw' or a FAISS factory string, got {index_type!r}")
    return ALIASES.get(index_type.strip().lower(), index_type.strip())


def new_index(index_type: str, dim: int) -> faiss.Index:
    """An empty inner-product index of this type and dimension; RetrieverError if FAISS rejects the string."""
    factory = factory_string(index_type)
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1][:200]
        raise RetrieverError(f"index type {index_type!r} is not a FAISS factory string usable at dim {dim} ({reason}); "
                             "use flat, hnsw, or e.g. HNSW32, IVF4096,Flat, IVF4096,PQ64,RFlat") from None
    _tune_training(index)
    return index


def _tune_training(index: faiss.Index) -> None:
    """HNSW efConstruction 200; no polysemous PQ training (the factory's default: minutes, unused by search)."""
    idx = faiss.downcast_index(index)
    if hasattr(idx, "hnsw"):
        idx.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    if hasattr(idx, "do_polysemous_training"):
        idx.do_polysemous_training = False
    for child in ("base_index", "index", "quantizer"):  # IndexRefine / IndexPreTransform / IVF coarse quantizer
        sub = getattr(idx, child, None)
        if isinstance(sub, faiss.Index):
            _tune_training(sub)


def training_need(index: faiss.Index) -> tuple[int, str]:
    """The fewest training vectors an index's trainable parts need (FAISS's k-means refuses fewer points than
    centroids), and which part needs them; (0, "") for an index that trains nothing."""
    idx = faiss.downcast_index(index)
    needs = [(0, "")]
    if isinstance(idx, faiss.IndexIVF):
        needs.append((idx.nlist, "its IVF lists"))
    pq = getattr(idx, "pq", None)
    if isinstance(pq, faiss.ProductQuantizer):
        needs.append((pq.ksub, f"its PQ codebooks: 2^{pq.nbits} centroids each"))
    for child in ("base_index", "index", "quantizer", "storage"):
        sub = getattr(idx, child, None)
        if isinstance(sub, faiss.Index):
            needs.append(training_need(sub))
    return max(needs, key=lambda n: n[0])


def check_training_size(index_type: str, index: faiss.Index, count: int, train_size: int) -> None:
    """RetrieverError, naming the fix, when ``min(train_size, count)`` vectors are too few to train ``index``."""
    need, part = training_need(index)
    n = min(train_size, count)
    if n >= need:
        return
    if count >= need:
        fix = f"raise --train-size (retriever.train_size) to >= {need}"
    elif part.startswith("its IVF"):
        fix = f"use a smaller nlist (e.g. IVF{max(1, int(count ** 0.5))},Flat), or --index flat"
    else:
        fix = "use fewer bits per code (e.g. PQ16x4), or --index flat"
    raise RetrieverError(f"index type {index_type!r} trains on {n} vectors but needs >= {need} ({part}); {fix}")


def set_search_params(index: faiss.Index, nprobe: int = 0, ef_search: int = 0, k_factor: int = 0) -> dict[str, int]:
    """Apply the search-time parameters this index has (0 = leave FAISS's value); returns those applied."""
    applied, space = {}, faiss.ParameterSpace()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search), ("quantizer_efSearch", ef_search),
                        ("k_factor_rf", k_factor)):
        if value > 0:
            try:
                space.set_index_parameter(index, name, value)
                applied[name] = value
            except RuntimeError:
                pass  # this index type has no such parameter
    return applied


def to_gpu(index: faiss.Index) -> faiss.Index:
    """The index on GPU 0 when faiss-gpu and a GPU are present and the type is supported; else unchanged."""
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        log.warning("retriever.use_gpu is set but faiss has no GPU here (install faiss-gpu-cu12); searching on CPU")
        return index
    try:
        gpu = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    except RuntimeError as exc:
        log.warning("index type %s cannot move to GPU (%s); searching on CPU", type(index).__name__, exc)
        return index
    gpu.referenced_resources = True  # keep the resources alive as long as the index
    return gpu


# ---------------------------------------------------------------- vector sources


class Vectors:
    """Rows of passage vectors, L2-normalised float32, read or encoded a chunk at a time."""

    count: int
    dim: int

    def rows(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def sample(self, rows: np.ndarray) -> np.ndarray:
        """Vectors of sorted row numbers ``rows`` (the training sample)."""
        return np.concatenate([self.rows(int(r), int(r) + 1) for r in rows])


def _normalised(x: np.ndarray) -> np.ndarray:
    x = np.require(x, np.float32, ["C", "W", "O"])  # copies only views and other dtypes
    faiss.normalize_L2(x)
    return x


class NpyVectors(Vectors):
    """A (count, dim) ``.npy`` file; chunks are read with plain reads (no mapped pages stay resident)."""

    def __init__(self, path: Path):
        try:
            self._x = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise RetrieverError(f"embeddings {path} cannot be read as a .npy array ({exc})") from None
        if self._x.ndim != 2 or not np.issubdtype(self._x.dtype, np.floating) or not self._x.flags.c_contiguous:
            raise RetrieverError(f"embeddings {path} must be a 2-D C-order float array (passages x dim), "
                                 f"got shape {self._x.shape} of {self._x.dtype}")
        self.count, self.dim = self._x.shape
        self._path = path

    def rows(self, start: int, stop: int) -> np.ndarray:
        with open(self._path, "rb") as f:
            f.seek(self._x.offset + start * self.dim * self._x.itemsize)
            x = np.fromfile(f, self._x.dtype, (stop - start) * self.dim)
        return _normalised(x.reshape(stop - start, self.dim))

    def sample(self, rows: np.ndarray) -> np.ndarray:
        return _normalised(self._x[rows])


def _numeric_list(t: pa.DataType) -> bool:
    """Whether a column type is a list of numbers (a vector per row)."""
    lists = pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t)
    return lists and (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type))


class ParquetVectors(Vectors):
    """A Parquet file whose first list column of numbers holds one vector per row (read by row group)."""

    def __init__(self, path: Path):
        try:
            self._file = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise RetrieverError(f"embeddings {path} cannot be read as Parquet ({exc})") from None
        schema = self._file.schema_arrow
        cols = [f.name for f in schema if _numeric_list(f.type)]
        if not cols:
            raise RetrieverError(f"embeddings {path} has no column of number lists (vectors) (columns: "
                                 f"{', '.join(f'{f.name}: {f.type}' for f in schema)})")
        self._col, self._path = cols[0], path
        meta = self._file.metadata
        self.count = meta.num_rows
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._starts = np.cumsum([0, *sizes])
        self._cached: tuple[int, np.ndarray] | None = None
        self.dim = -1  # row 0's, once read
        self.dim = self._group(int(np.searchsorted(self._starts, 0, side="right")) - 1).shape[1] if self.count else 0

    def _group(self, g: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != g:
            col = self._file.read_row_group(g, columns=[self._col]).column(0).combine_chunks()
            where = f"embeddings {self._path} column {self._col!r}, row group {g}"
            if col.null_count:
                row = int(self._starts[g]) + int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
                raise RetrieverError(f"{where}: row {row} has no vector (null); every corpus passage needs one")
            sizes = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            dim = self.dim if self.dim >= 0 else int(sizes[0])
            if (sizes != dim).any():
                row = int(np.argmax(sizes != dim))
                raise RetrieverError(f"{where}: row {int(self._starts[g]) + row} has {sizes[row]} values, but row 0 "
                                     f"has {dim}; every vector needs the same dimension")
            flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            self._cached = (g, flat.reshape(len(col), dim))
        return self._cached[1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        out = []
        while start < stop:
            g = int(np.searchsorted(self._starts, start, side="right")) - 1
            take = self._group(g)[start - self._starts[g]: stop - self._starts[g]]
            out.append(take)
            start += len(take)
        return _normalised(np.concatenate(out))


class EncodedVectors(Vectors):
    """Passages of the partial build's stores, encoded on demand."""

    def __init__(self, stores: list[PassageStore], bounds: list[tuple[int, int]], encoder: Encoder, batch_size: int):
        self._stores, self._bounds, self._encoder, self._batch = stores, bounds, encoder, batch_size
        self.count, self.dim = bounds[-1][1], encoder.dim

    def _texts(self, start: int, stop: int) -> list[str]:
        out: list[str] = []
        for store, (a, b) in zip(self._stores, self._bounds, strict=True):
            lo, hi = max(start, a), min(stop, b)
            if lo < hi:
                out.extend(store.texts(lo - a, hi - a))
        return out

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self._encoder.encode_passages(self._texts(start, stop), self._batch)

    def sample(self, rows: np.ndarray) -> np.ndarray:
        texts = [t for r in rows for t in self._texts(int(r), int(r) + 1)]
        return self._encoder.encode_passages(texts, self._batch)


def check_finite(source: Vectors, name: str | Path, chunk_size: int) -> None:
    """RetrieverError naming the first row that is not finite (NaN or inf), read ``chunk_size`` rows at a time."""
    for start in range(0, source.count, chunk_size):
        bad = ~np.isfinite(source.rows(start, min(source.count, start + chunk_size))).all(axis=1)
        if bad.any():
            raise RetrieverError(f"embeddings {name} row {start + int(np.argmax(bad))} is not finite (NaN or inf); "
                                 "re-encode the passages, or build without --embeddings to encode them here")


def open_vectors(path: str | Path) -> Vectors:
    """Precomputed passage vectors: ``.npy`` (memory-mapped) or ``.parquet`` (a list<float> column)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise RetrieverError(f"embeddings file {p} does not exist; pass a .npy or .parquet of passage vectors")
    if p.suffix == ".npy":
        return NpyVectors(p)
    if p.suffix == ".parquet":
        return ParquetVectors(p)
    raise RetrieverError(f"embeddings file {p} must end in .npy or .parquet")


# ---------------------------------------------------------------- streamed, resumable build


def _write_index(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` atomically. The bytes go through a Python file (a chunk at a time, so no second
    copy of the index is held), so a short write or a failed final flush (a full disk) raises OSError, naming
    ``path``, and nothing is renamed into place: ``faiss.write_index(index, name)`` only prints a failed close on
    stderr and returns as if the truncated file were whole."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            faiss.write_index(index, faiss.PyCallbackIOWriter(f.write))
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def train_template(index_type: str, source: Vectors, train_size: int, seed: int = 0) -> faiss.Index:
    """An empty index of this type, trained (when it needs training) on ``train_size`` rows sampled uniformly."""
    index = new_index(index_type, source.dim)
    if not index.is_trained:
        n = min(train_size, source.count)
        rows = np.sort(np.random.default_rng(seed).choice(source.count, n, replace=False))
        log.info("training %s on %d sampled vectors", factory_string(index_type), n)
        index.train(source.sample(rows))
    return index


class VectorWriter:
    """Appends float32 rows to a ``.npy`` of known final shape with plain writes (no mapped pages to count against
    the build's memory), from row ``resume_at`` on: rows after it, from an interrupted build, are cut off."""

    def __init__(self, path: Path, rows: int, dim: int, resume_at: int = 0):
        self._f = open(path, "r+b" if resume_at else "wb")  # noqa: SIM115 (closed by close())
        if resume_at:
            np.lib.format.read_magic(self._f)
            np.lib.format.read_array_header_1_0(self._f)
        else:
            np.lib.format.write_array_header_1_0(self._f, {"descr": "<f4", "fortran_order": False, "shape": (rows, dim)})
        self._f.seek(self._f.tell() + resume_at * dim * 4)
        self._f.truncate()

    def write(self, rows: np.ndarray) -> None:
        self._f.write(np.ascontiguousarray(rows, dtype="<f4").tobytes())

    def flush(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self.flush()
        self._f.close()


def fill_index(index: faiss.Index, source: Vectors, start: int, stop: int, chunk_size: int, bar: tqdm,
               checkpoint: Any = None, checkpoint_s: float = 300.0, stored: VectorWriter | None = None) -> faiss.Index:
    """Add rows ``start..stop-1`` (after the ``index.ntotal`` already added) a chunk at a time.

    ``checkpoint(index, added)`` is called every ``checkpoint_s`` seconds (0 = after every chunk).
    ``stored`` also receives every added vector.
    """
    last = time.monotonic()
    row = start + index.ntotal
    while row < stop:
        end = min(stop, row + chunk_size)
        chunk = source.rows(row, end)
        index.add(chunk)
        if stored is not None:
            stored.write(chunk)
        bar.update(end - row)
        row = end
        if checkpoint is not None and row < stop and time.monotonic() - last >= checkpoint_s:
            if stored is not None:
                stored.flush()  # the stored rows a resumed build skips are on disk before the progress says so
            checkpoint(index, row - start)
            last = time.monotonic()
    return index


def _check_out(out_dir: str | Path, work: str) -> Path:
    """``out_dir`` normalised, once an index may be built or reused there (nothing written): a new or empty
    directory, one marked as a ZipRL index, or a complete index of an older ZipRL (unmarked: reused, never written).
    The work directory beside it (``.<name>.<work>``) must be missing or one a build marked."""
    out, used = checked_dir(out_dir, "index")
    old = read_manifest(out) if used else None
    if used and read_marker(out) is None and (old is None or missing_files(out, old)):
        raise RetrieverError(f"{out} is a non-empty directory that is not a ZipRL index (it {no_marker(out)}); "
                             "nothing was written: choose another output directory")
    part = out.with_name(f".{out.name}.{work}")
    if os.path.lexists(part) and not _killed_start(part):
        marker = read_marker(part) if part.is_dir() and not part.is_symlink() else None
        if marker is None or marker["kind"] != "index":
            raise RetrieverError(f"{part} is in the way: a build works there, but no build marked it; nothing was "
                                 "written: remove it yourself, or choose another output directory")
        refuse_links(part)
    return out


def _killed_start(work: Path) -> bool:
    """Whether the work directory ``work`` is one a build (or adopt) was killed in, or ran out of space in, between
    creating it and marking it: a directory (no link) holding nothing, or only a marker temporary. A rerun takes it
    back like a marked one."""
    return work.is_dir() and not work.is_symlink() and all(marker_leftover(p) for p in work.iterdir())


def _clear_work(work: Path) -> None:
    """Delete the work directory ``work`` (a marked one, or a killed start: :func:`_check_out` checked it), its marker
    last, so that a kill midway leaves it marked, or empty, and a rerun still takes it back."""
    if not os.path.lexists(work):
        return
    for p in work.iterdir():
        if p.name != MARKER:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    (work / MARKER).unlink(missing_ok=True)
    work.rmdir()


def _out_or_refusal(out_dir: str | Path, work: str) -> tuple[Path, UserError | None]:
    """:func:`_check_out`'s answer and None; or, where it refuses a directory that holds a complete index (marked as
    one, or unmarked from an older ZipRL) -- a read-only cache, a work directory in the way --, ``out_dir``
    normalised and the refusal, which the caller raises unless that index is up to date (reusing it writes nothing)."""
    try:
        return _check_out(out_dir, work), None
    except UserError as exc:
        out = normalise(out_dir)
        marker = read_marker(out) if out.is_dir() else None
        marked = marker["kind"] == "index" if marker is not None else not os.path.lexists(out / MARKER)
        old = read_manifest(out) if out.is_dir() and marked else None
        if old is None or missing_files(out, old):
            raise
        return out, exc


def mount_point(path: Path) -> bool:
    """Whether the directory ``path`` is a mount point: on another device than its parent, or listed in
    ``/proc/self/mountinfo`` (a bind mount of the same file system, which a rename cannot cross either)."""
    if os.path.ismount(path):
        return True
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    octal = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040
    return any(len(f := line.split()) > 4 and octal.sub(lambda m: chr(int(m[1], 8)), f[4]) == str(path)
               for line in lines)


def _check_mount(out: Path) -> None:
    """RetrieverError (nothing written) when the existing ``out`` is a mount point: the build's work directory beside
    it is on another file system, and no rename can move the finished index in."""
    if out.is_dir() and mount_point(out):
        raise RetrieverError(f"--out {out} is a mount point: a build works beside it, in {out.parent}, and no rename "
                             "moves the finished index across mounts; nothing was written: build into a directory "
                             f"inside it, e.g. --out {out / 'index'}")


REPLACE_HINT = "pass --overwrite to replace it, or choose another output directory"


def _check_replace(out: Path, overwrite: bool, how: str = REPLACE_HINT) -> tuple[Path, ...]:
    """The entries replacing the index in ``out`` deletes (none for a new or empty directory). Refused, nothing
    written, unless it is a marked ZipRL index holding only index files and no link, and ``overwrite`` is given; the
    refusal names ``how`` to replace it."""
    if not out.is_dir() or not used(out):
        return ()
    if read_marker(out) is None:
        raise RetrieverError(f"{out} holds an index of an older ZipRL (no {MARKER} marker) for other inputs or "
                             "settings; nothing was written: delete it yourself to rebuild it there, or choose "
                             "another output directory")
    if not overwrite:
        raise RetrieverError(f"{out} holds a ZipRL index of other inputs or settings; nothing was written: {how}")
    return plan_replace(out, "index", is_index_entry)


def _install_plan(out: Path, overwrite: bool, waits: str) -> tuple[Path, ...]:
    """The entries of ``out`` to delete before a finished index moves in, planned now (a file may have appeared
    since the build began); refused, nothing deleted, for any entry without ``overwrite`` and for a foreign one."""
    if not used(out):
        return ()
    if not overwrite:
        names = sorted(p.name for p in out.iterdir() if p.name not in (MARKER, LOCK))
        raise OutputError(f"{out} was written while the index was built ({shown(names)}); nothing in it was deleted "
                          f"and {waits}: move those entries out of it and run the same command again")
    try:
        return plan_replace(out, "index", is_index_entry)
    except OutputError as exc:
        raise OutputError(f"{exc} (written while the index was built); {waits}: run the same command again once "
                          "they are moved out") from None


def install(work: Path, out: Path, overwrite: bool, waits: str | None = None) -> None:
    """Move the finished index in ``work`` into ``out`` entry by entry, the manifest last; ``out`` itself is never
    renamed. The entries of ``out`` are planned again first (:func:`_install_plan`, whose refusal says ``waits``)
    and only they are deleted. The plan goes into ``work``'s progress file before anything is deleted, so calling
    this again finishes an interrupted install."""
    waits = waits or f"the finished index waits in {work}"
    state = read_json(work / PROGRESS_FILE) or {}
    swap = state.get("swap")
    if swap is None:
        old = _install_plan(out, overwrite, waits)
        names = [n for n in os.listdir(work) if n not in (PROGRESS_FILE, MARKER)]
        swap = {"delete": [p.name for p in old], "move": sorted(names, key=lambda n: (n == MANIFEST_FILE, n))}
        atomic_write_json(work / PROGRESS_FILE, state | {"swap": swap})
    else:  # out holds the old entries not deleted yet and the new ones moved in, and nothing else
        foreign = sorted(n for n in set(os.listdir(out)) - {MARKER, LOCK, *swap["delete"], *swap["move"]}
                         if not marker_leftover(out / n))  # what a kill while marking out left: removed below
        if foreign:
            raise OutputError(f"{out} was written while the index was installed ({shown(foreign)}); nothing more was "
                              f"deleted and {waits}: move those entries out of it and run the same command again")
    for p in out.iterdir():  # under the lock: no write of the marker runs now
        if marker_leftover(p):
            p.unlink()
    write_marker(out, "index")
    pending = {n for n in swap["move"] if os.path.lexists(work / n)}  # the others are in out already
    delete([out / n for n in sorted(swap["delete"], key=lambda n: n != MANIFEST_FILE)
            if (n in pending or n not in swap["move"]) and os.path.lexists(out / n)])
    for name in swap["move"]:
        if name in pending:
            os.replace(work / name, out / name)
    fsync(out)
    (work / PROGRESS_FILE).unlink()
    (work / MARKER).unlink(missing_ok=True)
    work.rmdir()


def index_differences(out_dir: str | Path, index_type: str, shards: int, store_vectors: bool) -> list[str]:
    """How the index in ``out_dir`` differs in type, shards or stored vectors from one of these settings (its
    manifest only: the corpus is compared when the index is built); [] for a new or empty directory. RetrieverError
    (nothing written) when ``out_dir`` cannot hold an index at all."""
    out, _ = _out_or_refusal(out_dir, "partial")  # a refused complete index: build_index refuses it unless reused
    old = read_manifest(out) if out.is_dir() else None
    if old is None:
        return []
    now = {"factory": factory_string(index_type), "shards": shards, "store_vectors": store_vectors}
    return [f"{key} {old.get(key, False)!r} there, {value!r} now" for key, value in now.items()
            if old.get(key, False) != value]


def _progress(work: Path, build: dict) -> dict[str, Any] | None:
    """The progress of the partial build in ``work`` when it is one of these inputs and settings, else None."""
    state = read_json(work / PROGRESS_FILE)
    return state if state is not None and build_key(state.get("build") or {}) == build else None


def _up_to_date(out: Path, build: dict) -> bool:
    old = read_manifest(out)
    return old is not None and not missing_files(out, old) and build_key(old) == build


def _embeddings_key(path: str | Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    st = p.stat()
    return {"path": str(p), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _drop_leftovers(folders: list[Path]) -> None:
    """Delete what killed runs of this build left in its work folders: superseded checkpoints, temporary files."""
    for folder in folders:
        for p in folder.iterdir():
            if LEFTOVER.fullmatch(p.name) and p.is_file() and not p.is_symlink():
                p.unlink()


def build_index(corpus_path: str | Path, out_dir: str | Path, encoder: Encoder | None = None,
                index_type: str = "flat", batch_size: int = 64, progress: bool = True, *, shards: int = 1,
                chunk_size: int = 65536, train_size: int = 262144, embeddings: str | Path | None = None,
                checkpoint_s: float = 300.0, store_vectors: bool = False, overwrite: bool = False,
                wait: bool = True, replace_hint: str = REPLACE_HINT) -> Path:
    """Build (or reuse, or resume) an index directory for a JSONL corpus of any size. Returns ``out_dir``
    (normalised).

    Vectors come from ``embeddings`` (a ``.npy``/``.parquet`` aligned row for row with the corpus) or
    from ``encoder``. Every input is checked before any vector is encoded or added. ``store_vectors`` also
    writes each shard's float32 vectors to ``vectors.npy``, which search memory-maps to re-rank a compressed
    index's candidates exactly (see ``Retriever.load``).

    ``out_dir`` follows the output rule (:mod:`ziprl.outputs`): new, or marked as a ZipRL index; an index of other
    inputs or settings there is replaced only with ``overwrite`` (the command's ``--overwrite``; a cached index
    is rebuilt when its corpus changes), else refused naming ``replace_hint``, and an unmarked one of an older ZipRL
    only reused, never written; ``overwrite`` is refused when it would delete an input (corpus, embeddings,
    encoder). The finished index moves into ``out`` entry by entry (:func:`install`), so an existing mount point is
    refused. While another process builds ``out``, this one waits and then reuses its index (``wait``; False:
    refuses, naming it, as the command does), so the replicas of a retriever deployment build a missing index once.
    """
    for name, value, low in (("batch_size", batch_size, 1), ("shards", shards, 1), ("chunk_size", chunk_size, 1),
                             ("train_size", train_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise RetrieverError(f"{name} must be an integer >= {low}, got {value!r}")
    factory = factory_string(index_type)
    out, refused = _out_or_refusal(out_dir, "partial")
    source = open_vectors(embeddings) if embeddings is not None else None
    scan = scan_corpus(corpus_path, progress)
    if shards > scan.count:
        raise RetrieverError(f"shards={shards} is more than the corpus's {scan.count} passages")
    encoder = encoder or Encoder(batch_size=batch_size)
    if source is not None and source.count != scan.count:
        raise RetrieverError(f"embeddings {embeddings} hold {source.count} vectors but corpus {corpus_path} has "
                             f"{scan.count} passages; they must be aligned row for row")
    dim = source.dim if source is not None else encoder.dim
    if source is not None and encoder.dim != dim:
        raise RetrieverError(f"embeddings {embeddings} are {dim}-dim but query encoder {encoder.encoder_id} gives "
                             f"{encoder.dim}-dim vectors; pass the encoder that made them (--encoder)")
    template = new_index(index_type, dim)  # also validates the factory string at this dim
    trained = not template.is_trained
    check_training_size(index_type, template, scan.count, train_size)
    manifest = {
        "format": FORMAT_VERSION, "corpus_sha256": scan.sha256, "count": scan.count, "dim": dim,
        "encoder": encoder.encoder_id, "encoder_path": str(encoder.path) if encoder.path else None,
        "query_prefix": encoder.query_prefix, "passage_prefix": encoder.passage_prefix,
        "index_type": index_type, "factory": factory, "shards": shards, "embeddings": _embeddings_key(embeddings),
        "train_size": min(train_size, scan.count) if trained else None, "metric": "inner_product",
        "store_vectors": store_vectors,
    }
    build = build_key(manifest)
    if _up_to_date(out, build):
        log.info("index %s is up to date with %s (%d passages); reusing it", out, corpus_path, scan.count)
        return out
    if refused is not None:  # e.g. a read-only cache: only an up-to-date index there can be used
        raise refused
    work = out.with_name(f".{out.name}.partial")
    inputs = (corpus_path, embeddings, encoder.path)
    state = _progress(work, build)
    if state is None or "swap" not in state:  # an interrupted install of this build is finished as planned
        refuse_inputs_inside(_check_replace(out, overwrite, replace_hint), inputs)
    _check_mount(out)
    if source is not None and state is None:  # a resumed build's vectors were checked when it started
        check_finite(source, embeddings, chunk_size)
    resumed = state is not None
    with locked(out, wait):  # a second build of out waits, or is refused, until this one ends
        _check_out(out, "partial")  # checked again under the lock: another build may have finished meanwhile
        if _up_to_date(out, build):
            return out
        state = _progress(work, build)
        if state is not None and "swap" in state:
            log.info("finishing the install of the index built in %s", work)
            install(work, out, overwrite)
            return out
        refuse_inputs_inside(_check_replace(out, overwrite, replace_hint), inputs)
        if state is None:
            if source is not None and resumed:  # another build changed the partial one meanwhile
                check_finite(source, embeddings, chunk_size)
            _clear_work(work)  # a partial build of other inputs (marked, or a killed start: checked above)
            work.mkdir()
            write_marker(work, "index")  # a build's own: a rerun may resume it or delete it
            state = {"build": build, "stored": False, "trained": False, "added": [0] * shards,
                     "files": [None] * shards}
            atomic_write_json(work / PROGRESS_FILE, state)
        else:
            log.info("resuming the build in %s (%d of %d vectors added)", work, sum(state["added"]), scan.count)
        bounds = shard_bounds(scan.count, shards)
        parts = [shard_dir(work, s, shards) for s in range(shards)]
        if not state["stored"]:
            passages = (p for _, p in iter_corpus(corpus_path))
            for part, (a, b) in zip(parts, bounds, strict=True):
                part.mkdir(exist_ok=True)
                write_store(islice(passages, b - a), part, scan.id_hashes[a:b])
            state["stored"] = True
            atomic_write_json(work / PROGRESS_FILE, state)
        stores = [PassageStore(part) for part in parts]
        if source is None:
            source = EncodedVectors(stores, bounds, encoder, batch_size)
        if not state["trained"]:
            _write_index(train_template(index_type, source, train_size), work / TRAINED_FILE)
            state["trained"] = True
            atomic_write_json(work / PROGRESS_FILE, state)
        with tqdm(total=scan.count, initial=sum(state["added"]), desc="adding vectors", unit="vec",
                  disable=not progress) as bar:
            for s, (part, (a, b)) in enumerate(zip(parts, bounds, strict=True)):
                if state["files"][s] == INDEX_FILE:
                    continue
                name = state["files"][s]
                index = faiss.read_index(str(part / name) if name else str(work / TRAINED_FILE))

                def checkpoint(idx: faiss.Index, added: int, s: int = s, part: Path = part) -> None:
                    name = f"index.partial-{added}.faiss"
                    _write_index(idx, part / name)
                    previous, state["files"][s], state["added"][s] = state["files"][s], name, added
                    atomic_write_json(work / PROGRESS_FILE, state)
                    if previous:
                        (part / previous).unlink(missing_ok=True)

                stored = VectorWriter(part / VECTORS_FILE, b - a, dim, index.ntotal) if store_vectors else None
                fill_index(index, source, a, b, chunk_size, bar, checkpoint, checkpoint_s, stored)
                if stored is not None:
                    stored.close()
                _write_index(index, part / INDEX_FILE)
                previous, state["files"][s], state["added"][s] = state["files"][s], INDEX_FILE, b - a
                atomic_write_json(work / PROGRESS_FILE, state)
                if previous:
                    (part / previous).unlink(missing_ok=True)
                del index
        (work / TRAINED_FILE).unlink(missing_ok=True)
        _drop_leftovers(sorted({work, *parts}))
        manifest["shard_counts"] = [b - a for a, b in bounds]
        atomic_write_json(work / MANIFEST_FILE, manifest)
        install(work, out, overwrite)
        return out


# ---------------------------------------------------------------- adopt


def adopt_index(faiss_file: str | Path, corpus_path: str | Path, out_dir: str | Path, encoder: Encoder | None = None,
                progress: bool = True, overwrite: bool = False) -> Path:
    """Make an index directory from a prebuilt FAISS index whose rows are the corpus's passages in order.

    Checks first that the index's count equals the corpus's and its dimension the encoder's. ``out_dir`` follows
    :func:`build_index`'s rule: an index already there is replaced only with ``overwrite``, and only when marked.
    """
    src = Path(faiss_file).expanduser()
    if not src.is_file():
        raise RetrieverError(f"FAISS index file {src} does not exist; pass the path of a file faiss.write_index wrote")
    out = _check_out(out_dir, "adopting")
    inputs = (src, corpus_path, encoder.path if encoder is not None else None)
    refuse_inputs_inside(_check_replace(out, overwrite), inputs)
    _check_mount(out)
    try:
        index = faiss.read_index(str(src), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError:
        raise RetrieverError(f"{src} is not a FAISS index file (faiss.read_index cannot read it); pass a file "
                             "faiss.write_index wrote") from None
    encoder = encoder or Encoder()
    if index.d != encoder.dim:
        raise RetrieverError(f"FAISS index {src} holds {index.d}-dim vectors but encoder {encoder.encoder_id} gives "
                             f"{encoder.dim}-dim vectors; pass the encoder it was built with (--encoder)")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        log.warning("%s uses metric %d, not inner product: scores are not cosine similarities", src, index.metric_type)
    scan = scan_corpus(corpus_path, progress)
    if index.ntotal != scan.count:
        raise RetrieverError(f"FAISS index {src} holds {index.ntotal} vectors but corpus {corpus_path} has "
                             f"{scan.count} passages; adopt needs one vector per passage, in corpus order")
    is_flat = type(faiss.downcast_index(index)) is faiss.IndexFlatIP
    manifest = {
        "format": FORMAT_VERSION, "corpus_sha256": scan.sha256, "count": scan.count, "dim": index.d,
        "encoder": encoder.encoder_id, "encoder_path": str(encoder.path) if encoder.path else None,
        "query_prefix": encoder.query_prefix, "passage_prefix": encoder.passage_prefix,
        "index_type": "flat" if is_flat else "adopted", "factory": "Flat" if is_flat else type(index).__name__,
        "shards": 1, "embeddings": None, "train_size": None, "adopted_from": src.name,
        "metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else str(index.metric_type),
        "shard_counts": [scan.count],
    }
    del index
    with locked(out):  # a second adopt or build of out is refused until this one ends
        _check_out(out, "adopting")  # checked again under the lock
        refuse_inputs_inside(_check_replace(out, overwrite), inputs)
        work = out.with_name(f".{out.name}.adopting")
        _clear_work(work)  # a killed adopt's (marked, or a killed start: checked above)
        work.mkdir()
        try:
            write_marker(work, "index")
            write_store((p for _, p in iter_corpus(corpus_path)), work, scan.id_hashes)
            shutil.copyfile(src, work / INDEX_FILE)
            atomic_write_json(work / MANIFEST_FILE, manifest)
            install(work, out, overwrite, "nothing was installed")
        except BaseException:
            with contextlib.suppress(OSError):  # the error that stopped the adopt is the one reported
                _clear_work(work)
            raise
    return out

