"""Build and query retrieval indexes from the command line.

    python -m ziprl.index build --corpus FILE.jsonl --out DIR [--encoder PATH] [--query-prefix P]
                                [--passage-prefix P] [--index flat|hnsw] [--batch-size N]
    python -m ziprl.index search --index DIR "query" [-k 5]
    python -m ziprl.index open --index DIR DOC_ID
"""

from __future__ import annotations

import argparse
import logging
import sys

from ziprl.env.retriever import INDEX_TYPES, Encoder, Retriever, build_index
from ziprl.errors import run_command


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ziprl.index", description="Build and query ZipRL FAISS indexes.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="encode a JSONL corpus into an index directory (reused when unchanged)")
    b.add_argument("--corpus", required=True, help="JSONL(.gz) corpus: one {id, title, text[, url]} per line")
    b.add_argument("--out", required=True, help="index directory to write")
    b.add_argument("--encoder", default=None, help="local sentence-transformers model dir (default all-MiniLM-L6-v2)")
    b.add_argument("--query-prefix", default="", help='e.g. "query: " for E5')
    b.add_argument("--passage-prefix", default="", help='e.g. "passage: " for E5')
    b.add_argument("--index", default="flat", choices=INDEX_TYPES, help="FAISS index type")
    b.add_argument("--batch-size", type=int, default=64)
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = sub.add_parser("search", help="print the top-k passages for a query")
    s.add_argument("--index", required=True, help="index directory")
    s.add_argument("query")
    s.add_argument("-k", type=int, default=5)
    o = sub.add_parser("open", help="print one passage in full")
    o.add_argument("--index", required=True, help="index directory")
    o.add_argument("doc_id")
    return ap


@run_command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "build":
        encoder = Encoder(args.encoder, args.query_prefix, args.passage_prefix, args.batch_size)
        out = build_index(args.corpus, args.out, encoder, args.index, args.batch_size, not args.no_progress)
        print(out)
    elif args.command == "search":
        for rank, hit in enumerate(Retriever.load(args.index).search([args.query], args.k)[0], start=1):
            print(f"{rank}. [{hit.doc_id}] {hit.title}  (score {hit.score:.3f})\n   {hit.snippet}")
    else:
        p = Retriever.load(args.index).open(args.doc_id)
        print(f"[{p.doc_id}] {p.title}\n{p.text}" + (f"\n{p.url}" if p.url else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
