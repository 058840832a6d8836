"""Dense retrieval over an index directory: batched search (over one or many shards) and ``open``.

An index directory (see :mod:`ziprl.retrieval.index_files`) holds FAISS indexes (inner product over
L2-normalised float32 vectors = cosine, any FAISS factory type), the passages in a memory-mapped
store (:mod:`ziprl.retrieval.passage_store`) and ``manifest.json`` (what it was built from). Building is
:mod:`ziprl.retrieval.index_build`; the encoder is :mod:`ziprl.retrieval.encoder` (torch imported on first use).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa

from ziprl.paths import cache_root
from ziprl.retrieval.encoder import DEFAULT_ENCODER_ID, Encoder, default_model_dir
from ziprl.retrieval.index_build import (
    REPLACE_HINT,
    adopt_index,
    build_index,
    factory_string,
    set_search_params,
    to_gpu,
)
from ziprl.retrieval.index_files import (
    FORMAT_VERSION,
    INDEX_FILE,
    MANIFEST_FILE,
    VECTORS_FILE,
    RetrieverError,
    UnknownDocument,
    missing_files,
    read_manifest,
    shard_dir,
)
from ziprl.retrieval.passage_store import DamagedStore, PassageStore, passage_text
from ziprl.retrieval.types import Hit, Passage

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_ENCODER_ID", "Encoder", "Retriever", "RetrieverError", "UnknownDocument", "adopt_index",
           "build_index", "default_index_dir", "default_model_dir", "merge_hits", "passage_text", "rebuild_hint"]


def default_index_dir(corpus_path: str | Path, encoder: Encoder, index_type: str, shards: int = 1,
                      store_vectors: bool = False) -> Path:
    """``<cache>/index/<corpus stem>-<hash of corpus path and settings>``."""
    corpus = Path(corpus_path).expanduser().resolve()
    from ziprl.retrieval.datasets import SAMPLE_DIR

    stem = "sample" if corpus.parent == SAMPLE_DIR else corpus.name.split(".")[0]
    settings = [str(corpus), encoder.encoder_id, encoder.query_prefix, encoder.passage_prefix, index_type]
    key = json.dumps(settings + ([shards] if shards > 1 else []) + (["vectors"] if store_vectors else []))
    return cache_root() / "index" / f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def rebuild_hint(index_dir: str | Path | None, corpus: str | Path) -> str:
    """How to replace the index a config's ``retriever.index_dir`` names (the cache's own is replaced by itself)."""
    if index_dir is None:
        return REPLACE_HINT
    return (f"set retriever.index_dir to another directory, or rebuild it there: python -m ziprl.index build "
            f"--corpus {corpus} --out {index_dir} --overwrite (with the run's --index and --shards)")


def _rebuild(index_dir: Path) -> str:
    """How to rebuild an index directory that cannot be searched (``--overwrite`` replaces one that exists)."""
    again = " --overwrite" if index_dir.is_dir() else ""
    return f"rebuild it with: python -m ziprl.index build --corpus CORPUS.jsonl --out {index_dir}{again}"


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else f"{text[:57]}..."


MANIFEST_RULES = (("format", _positive, "an integer >= 1"), ("count", _positive, "an integer >= 1"),
                  ("dim", _positive, "an integer >= 1"), ("shards", _positive, "an integer >= 1"),
                  ("encoder", _text, "text"), ("encoder_path", lambda v: v is None or _text(v), "text or null"),
                  ("query_prefix", _text, "text"), ("passage_prefix", _text, "text"), ("index_type", _text, "text"),
                  ("store_vectors", lambda v: isinstance(v, bool), "true or false"))
OPTIONAL = {"store_vectors"}  # written by newer builds only


def check_manifest(manifest: dict[str, Any], index_dir: Path) -> None:
    """RetrieverError naming the first field of an index's manifest that is missing or of the wrong type or range
    (a damaged or edited ``manifest.json``), and how to rebuild the index."""
    problems = [f"{key} is missing" if key not in manifest else f"{key} is {_shown(manifest[key])}, not {what}"
                for key, ok, what in MANIFEST_RULES
                if (key not in manifest and key not in OPTIONAL) or (key in manifest and not ok(manifest[key]))]
    counts = manifest.get("shard_counts")
    if not problems and not (isinstance(counts, list) and len(counts) == manifest["shards"]
                             and all(map(_positive, counts)) and sum(counts) == manifest["count"]):
        problems.append(f"shard_counts is {_shown(counts)}, not a list of {manifest['shards']} integers >= 1 "
                        f"summing to count {manifest['count']}")
    if problems:
        raise RetrieverError(f"{index_dir / MANIFEST_FILE} is damaged ({problems[0]}); {_rebuild(index_dir)}")


def merge_hits(per_shard: Sequence[list[list[Hit]]], k: int) -> list[list[Hit]]:
    """Per query, the ``k`` best hits over all shards by score (ties: earlier shard, then rank)."""
    if len(per_shard) == 1:
        return [hits[:k] for hits in per_shard[0]]
    return [sorted((h for shard in hits for h in shard), key=lambda h: -h.score)[:k]
            for hits in zip(*per_shard, strict=True)]


@dataclass
class Shard:
    """One FAISS index and the passages of its rows (and, if stored, their vectors, memory-mapped)."""

    index: faiss.Index
    store: PassageStore
    vectors: np.ndarray | None = None


def rerank_exact(vectors: np.ndarray, queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-``k`` among candidate ``rows`` (n, m; -1 = none) of memory-mapped ``vectors``.

    Reads each distinct candidate once, in row order; returns (scores, rows) of shape (n, k), -1 rows padding.
    """
    valid = rows >= 0
    wanted = np.unique(rows[valid])
    cand = np.asarray(vectors[wanted], dtype=np.float32)  # one sorted gather from disk / page cache
    pos = np.searchsorted(wanted, np.where(valid, rows, wanted[0] if len(wanted) else 0))
    scores = np.einsum("nmd,nd->nm", cand[pos], queries) if len(wanted) else np.zeros(rows.shape, np.float32)
    scores = np.where(valid, scores, -np.inf)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    best, picked = np.take_along_axis(scores, top, 1), np.take_along_axis(rows, top, 1)
    return best.astype(np.float32), np.where(np.isfinite(best), picked, -1)


# ---------------------------------------------------------------- search


class Retriever:
    """Batched dense search and ``open`` over the shards of one index directory (see :meth:`load`)."""

    def __init__(self, shards: list[Shard], manifest: dict[str, Any], encoder: Encoder, snippet_chars: int = 200,
                 check_dim: bool = False, path: Path | None = None, k_factor: int = 0):
        self.shards, self.manifest, self.encoder, self.snippet_chars = shards, manifest, encoder, snippet_chars
        self.path, self.k_factor = path, k_factor
        self.dim = int(manifest["dim"])
        self._total = int(manifest["count"])
        self._dim_checked = not check_dim

    @property
    def index(self) -> faiss.Index:
        """The FAISS index of a one-shard retriever."""
        if len(self.shards) != 1:
            raise AttributeError(f"this retriever has {len(self.shards)} shards; use .shards[i].index")
        return self.shards[0].index

    @classmethod
    def load(cls, index_dir: str | Path, encoder: Encoder | None = None, snippet_chars: int = 200, *,
             shards: Sequence[int] | None = None, nprobe: int = 0, ef_search: int = 128, k_factor: int = 0,
             use_gpu: bool = False) -> Retriever:
        """Open an index directory (all shards, or only ``shards``; ``[]`` = manifest and encoder only, for a
        router); ``encoder`` None = the one in its manifest.

        ``nprobe`` / ``ef_search`` / ``k_factor`` (re-ranking candidates per hit) apply to indexes that have
        them (0 = FAISS's default); ``use_gpu`` moves the indexes to GPU when faiss-gpu finds one.
        """
        d = Path(index_dir).expanduser()
        hint = _rebuild(d)
        if not d.is_dir():
            raise RetrieverError(f"index directory {d} does not exist; {hint}")
        manifest = read_manifest(d)
        written = manifest.get("format") if manifest is not None else FORMAT_VERSION
        if written is None or (_positive(written) and written != FORMAT_VERSION):
            raise RetrieverError(f"index directory {d} was written by an older ZipRL (format {written}, "
                                 f"this version reads format {FORMAT_VERSION}); {hint}")
        if manifest is not None:
            check_manifest(manifest, d)
        missing = missing_files(d, manifest)
        if missing:
            raise RetrieverError(f"index directory {d} is incomplete (missing {', '.join(missing)}); {hint}")
        if manifest is None:
            raise RetrieverError(f"{d / MANIFEST_FILE} is not a valid ZipRL index manifest; {hint}")
        n = manifest["shards"]
        wanted = list(range(n)) if shards is None else list(shards)
        if any(not 0 <= s < n for s in wanted):
            raise RetrieverError(f"shards {wanted} do not exist in {d}, which has shards 0..{n - 1}")
        loaded = []
        for s in wanted:
            part = shard_dir(d, s, n)
            try:
                index, store = faiss.read_index(str(part / INDEX_FILE)), PassageStore(part)
                vectors = np.load(part / VECTORS_FILE, mmap_mode="r") if manifest.get("store_vectors") else None
            except (RuntimeError, OSError, ValueError, pa.ArrowException) as exc:
                raise RetrieverError(f"index directory {part} cannot be read ({exc}); {hint}") from None
            shape = (manifest["shard_counts"][s], manifest["dim"])
            if vectors is not None and (vectors.shape != shape or not np.issubdtype(vectors.dtype, np.floating)):
                raise RetrieverError(f"{part / VECTORS_FILE} does not match its manifest (manifest: {shape[0]} "
                                     f"vectors of dim {shape[1]}; {VECTORS_FILE}: shape {vectors.shape} of "
                                     f"{vectors.dtype}); {hint}")
            if not (index.ntotal == len(store) == manifest["shard_counts"][s]) or index.d != manifest["dim"]:
                raise RetrieverError(
                    f"index directory {part} does not match its manifest (manifest: {manifest['shard_counts'][s]} "
                    f"passages, dim {manifest['dim']}; index.faiss: {index.ntotal}, dim {index.d}; passage store: "
                    f"{len(store)}); {hint}")
            set_search_params(index, nprobe, ef_search, k_factor)
            loaded.append(Shard(to_gpu(index) if use_gpu else index, store, vectors))
        check_dim = encoder is None  # a given encoder is checked now; the manifest's on first use (no torch yet)
        if encoder is None:
            encoder = Encoder(manifest["encoder_path"], manifest["query_prefix"], manifest["passage_prefix"])
        used = (encoder.encoder_id, encoder.query_prefix, encoder.passage_prefix)
        built = (manifest["encoder"], manifest["query_prefix"], manifest["passage_prefix"])
        if used != built:
            raise RetrieverError(f"index {d} was built with encoder/query prefix/passage prefix {built}, "
                                 f"but {used} was given; use the same settings or rebuild the index")
        retriever = cls(loaded, manifest, encoder, snippet_chars, check_dim, d, k_factor)
        if not check_dim:
            retriever._check_encoder_dim()
        return retriever

    @classmethod
    def from_config(cls, cfg: Any, shards: Sequence[int] | None = None) -> Retriever:
        """From a RetrieverConfig: load ``index_dir``, or build/reuse one for ``corpus`` (default: the shipped sample)."""
        custom = cfg.encoder is not None or cfg.query_prefix or cfg.passage_prefix
        encoder = Encoder(cfg.encoder, cfg.query_prefix, cfg.passage_prefix, cfg.batch_size) if custom else None
        search = {"nprobe": cfg.nprobe, "ef_search": cfg.ef_search, "k_factor": cfg.k_factor, "use_gpu": cfg.use_gpu}
        if cfg.index_dir is not None and cfg.corpus is None:
            return cls.load(cfg.index_dir, encoder, cfg.snippet_chars, shards=shards, **search)
        if cfg.corpus is not None:
            corpus = Path(cfg.corpus)
        else:
            from ziprl.retrieval.datasets import SAMPLE_DIR, corpus_for

            shipped = SAMPLE_DIR / "index"
            default = (factory_string(cfg.index_type) == "Flat" and cfg.shards == 1 and cfg.embeddings is None
                       and not cfg.store_vectors)
            if encoder is None and default and cfg.index_dir is None and not missing_files(shipped, {}):
                # prebuilt with the default encoder (saves minutes)
                return cls.load(shipped, None, cfg.snippet_chars, shards=shards, **search)
            corpus = corpus_for("sample")
        encoder = encoder or Encoder(batch_size=cfg.batch_size)
        out = cfg.index_dir if cfg.index_dir is not None else default_index_dir(corpus, encoder, cfg.index_type,
                                                                                cfg.shards, cfg.store_vectors)
        # the cache's own index is rebuilt when its inputs change; one the user named is never replaced
        build_index(corpus, out, encoder, cfg.index_type, cfg.batch_size, shards=cfg.shards, chunk_size=cfg.chunk_size,
                    train_size=cfg.train_size, embeddings=cfg.embeddings, store_vectors=cfg.store_vectors,
                    overwrite=cfg.index_dir is None, replace_hint=rebuild_hint(cfg.index_dir, corpus))
        return cls.load(out, encoder, cfg.snippet_chars, shards=shards, **search)

    def __len__(self) -> int:
        """Passages this retriever returns: those of its loaded shards, numbered in shard order for :meth:`hit_at`
        (the whole index unless :meth:`load` was given ``shards``)."""
        return sum(len(s.store) for s in self.shards)

    def _check_k(self, k: int) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self._total:
            raise RetrieverError(f"k must be an integer in 1..{self._total} (the corpus size), got {k!r}")

    def _check_encoder_dim(self) -> None:
        if self.encoder.dim != self.dim:
            raise RetrieverError(f"encoder {self.encoder.encoder_id} gives {self.encoder.dim}-dim vectors but index "
                                 f"{self.path or ''} holds {self.dim}-dim vectors; use the encoder it was built with or rebuild the index")
        self._dim_checked = True

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits for each query: one encoder call and one FAISS search per shard for the whole batch."""
        self._check_k(k)
        vectors = self.encode_queries(queries)
        return self.search_embeddings(vectors, k) if len(vectors) else []

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Check the queries and embed them: (n, dim) float32."""
        if isinstance(queries, str) or not isinstance(queries, Sequence):
            raise RetrieverError(f"queries must be a list of strings, got {type(queries).__name__}")
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise RetrieverError(f"query {i} is empty or not a string ({q!r}); every query needs some text")
        if not queries:
            return np.zeros((0, self.dim), np.float32)
        if not self._dim_checked:
            self._check_encoder_dim()
        return self.encoder.encode_queries(queries)

    def search_embeddings(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-``k`` hits for precomputed (n, dim) query embeddings, merged over the loaded shards."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise RetrieverError(f"query embeddings must have shape (n, {self.dim}), got {vectors.shape}")
        self._check_k(k)
        per_shard = []
        for shard in self.shards:
            if shard.vectors is None:
                scores, rows = shard.index.search(vectors, min(k, len(shard.store)))
            else:  # over-fetch from the compressed index, then score the candidates exactly
                _, cand = shard.index.search(vectors, min(k * max(self.k_factor, 1), len(shard.store)))
                scores, rows = rerank_exact(shard.vectors, vectors, cand, min(k, len(shard.store)))
            per_shard.append([[self._hit(shard.store, int(r), float(s)) for r, s in zip(rr, ss, strict=True) if r >= 0]
                              for rr, ss in zip(rows, scores, strict=True)])
        return merge_hits(per_shard, k)

    def _hit(self, store: PassageStore, row: int, score: float) -> Hit:
        doc_id, title, snippet, url = store.head(row, self.snippet_chars)
        return Hit(doc_id=doc_id, title=title, snippet=snippet, score=score, url=url)

    def open(self, doc_id: str) -> Passage:
        """The full passage with this id; UnknownDocument (a KeyError) when there is none."""
        if isinstance(doc_id, str):
            for shard in self.shards:
                try:
                    row = shard.store.row_of(doc_id.strip())
                except DamagedStore as exc:
                    raise RetrieverError(f"{exc}; {_rebuild(self.path or Path('INDEX_DIR'))}") from None
                if row is not None:
                    return shard.store.passage(row)
        raise UnknownDocument(f"unknown document id {doc_id!r}; open takes an id returned by search")

    # ------------------------------------------------ random access (env.retrieval_noise draws rows)

    def hit_at(self, row: int) -> Hit:
        """Passage ``row`` (0..len(self)-1) rendered as a search hit (score 0)."""
        for shard in self.shards:
            if 0 <= row < len(shard.store):
                return self._hit(shard.store, row, 0.0)
            row -= len(shard.store)
        raise IndexError(f"passage row out of range 0..{len(self) - 1}")
