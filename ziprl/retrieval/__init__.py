"""Retrieval and data: corpora and QA datasets, the encoder, FAISS index build and search, the passage store,
retrieval noise, and the plain data types they share with the env (:mod:`ziprl.retrieval.types`).

Imports neither torch nor Ray (sentence-transformers, which loads torch, only on an encoder's first use) and no
other ZipRL layer above it: :mod:`ziprl.env` builds on it, never the other way round.
"""
