"""Build, adopt and query retrieval indexes from the command line.

    python -m ziprl.index build --corpus FILE.jsonl --out DIR [--overwrite] [--encoder PATH] [--query-prefix P]
                                [--passage-prefix P] [--index flat|hnsw|FACTORY] [--shards N]
                                [--chunk-size N] [--train-size N] [--embeddings FILE.npy|FILE.parquet] [--store-vectors]
                                [--batch-size N]
    python -m ziprl.index adopt --faiss FILE.faiss --corpus FILE.jsonl --out DIR [--overwrite] [--encoder PATH]
                                [...prefixes]
    python -m ziprl.index search --index DIR "query" [-k 5] [--nprobe N] [--ef-search N] [--k-factor N]
    python -m ziprl.index open --index DIR DOC_ID

A build that is interrupted resumes from its last checkpoint when the same command is run again. ``DIR`` is new,
or an index ZipRL marked as its own: reused when its inputs and settings are the same, replaced only with
``--overwrite`` (see :mod:`ziprl.outputs`), which never deletes an input the command reads. An existing ``DIR`` is
kept (its mode and owner stay): the index is moved into it, so ``DIR`` may not be a mount point (pass a directory
inside it).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ziprl.boundary import run_command
from ziprl.cli.common import at_least
from ziprl.config import RetrieverConfig
from ziprl.retrieval.retriever import Encoder, Retriever, adopt_index, build_index

DEFAULTS = RetrieverConfig()


def _out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the index in --out when it was built from other inputs or settings (only an index "
                        "directory ZipRL marked as its own)")


def _encoder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoder", default=None, help="local sentence-transformers model dir (default all-MiniLM-L6-v2)")
    p.add_argument("--query-prefix", default="", help='e.g. "query: " for E5')
    p.add_argument("--passage-prefix", default="", help='e.g. "passage: " for E5')
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size, help="encoder batch size")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ziprl.index", description="Build and query ZipRL FAISS indexes.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="index a JSONL corpus (reused when unchanged, resumed when interrupted)")
    b.add_argument("--corpus", required=True, help="JSONL(.gz) corpus: one {id, title, text[, url]} per line")
    _out_args(b)
    _encoder_args(b)
    b.add_argument("--index", default=DEFAULTS.index_type, metavar="TYPE",
                   help='flat, hnsw or a FAISS factory string, e.g. "IVF4096,PQ64,RFlat" (IVF-PQ + exact re-rank)')
    b.add_argument("--shards", type=int, default=DEFAULTS.shards, help="split the corpus into N index shards")
    b.add_argument("--chunk-size", type=int, default=DEFAULTS.chunk_size, help="vectors encoded/added per chunk")
    b.add_argument("--train-size", type=int, default=DEFAULTS.train_size, help="vectors sampled to train IVF/PQ")
    b.add_argument("--embeddings", default=None, help="precomputed passage vectors (.npy/.parquet), one per corpus row")
    b.add_argument("--store-vectors", action="store_true",
                   help="also keep the float32 vectors on disk (memory-mapped at search) to re-rank "
                        "k-factor x k candidates of a compressed index (e.g. IVF-PQ) exactly")
    a = sub.add_parser("adopt", help="wrap a prebuilt FAISS index (one vector per corpus row, in order)")
    a.add_argument("--faiss", required=True, help="FAISS index file")
    a.add_argument("--corpus", required=True, help="the JSONL(.gz) corpus its rows are")
    _out_args(a)
    _encoder_args(a)
    s = sub.add_parser("search", help="print the top-k passages for a query")
    s.add_argument("--index", required=True, help="index directory")
    s.add_argument("query")
    s.add_argument("-k", type=int, default=5)
    s.add_argument("--nprobe", type=at_least(0), default=DEFAULTS.nprobe,
                   help="IVF lists visited per query; 0 = FAISS's default")
    s.add_argument("--ef-search", type=at_least(0), default=DEFAULTS.ef_search,
                   help="HNSW search breadth; 0 = FAISS's default")
    s.add_argument("--k-factor", type=at_least(0), default=DEFAULTS.k_factor,
                   help="re-ranked candidates per hit; 0 = FAISS's default")
    o = sub.add_parser("open", help="print one passage in full")
    o.add_argument("--index", required=True, help="index directory")
    o.add_argument("doc_id")
    return ap


@run_command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command in ("build", "adopt"):
        encoder = Encoder(args.encoder, args.query_prefix, args.passage_prefix, args.batch_size)
        if args.command == "build":
            out = build_index(args.corpus, args.out, encoder, args.index, args.batch_size, not args.no_progress,
                              shards=args.shards, chunk_size=args.chunk_size, train_size=args.train_size,
                              embeddings=args.embeddings, store_vectors=args.store_vectors, overwrite=args.overwrite,
                              wait=False)
        else:
            out = adopt_index(args.faiss, args.corpus, args.out, encoder, not args.no_progress, args.overwrite)
        print(out)
    elif args.command == "search":
        r = Retriever.load(args.index, nprobe=args.nprobe, ef_search=args.ef_search, k_factor=args.k_factor)
        for rank, hit in enumerate(r.search([args.query], args.k)[0], start=1):
            print(f"{rank}. [{hit.doc_id}] {hit.title}  (score {hit.score:.3f})\n   {hit.snippet}")
    else:
        p = Retriever.load(args.index).open(args.doc_id)
        print(f"[{p.doc_id}] {p.title}\n{p.text}" + (f"\n{p.url}" if p.url else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
