"""Index-build benchmark: passages/s of ``build_index`` vs the bare encoder on the same passages.

    .venv/bin/python benchmarks/index_build.py [--n 1000] [--repeats 3] [--index flat hnsw] [--batch-size 64]

Passages are the first ``n`` of the shipped sample corpus (real HotpotQA / MuSiQue / Wikipedia
paragraphs). The bare rate is one ``SentenceTransformer.encode`` call over the same "title\\ntext"
strings; the build rate is a full ``build_index`` into a fresh directory (validation, hashing, encoding,
FAISS add, Parquet + index writes). Runs alternate order (bare/build, build/bare, ...) and the median
wall-clock rates are compared; a process-CPU-time ratio is reported too, as it is less sensitive to
other load on a shared machine. Goal: build >= 0.9x bare. Results go to benchmarks/results/index_build.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import at_least, write_results  # noqa: E402

from ziprl.retrieval.corpus import load_corpus, write_corpus  # noqa: E402
from ziprl.retrieval.datasets import corpus_for  # noqa: E402
from ziprl.retrieval.retriever import Encoder, build_index, passage_text  # noqa: E402

GOAL = 0.9


def measure(n: int = 1000, repeats: int = 3, index_type: str = "flat", batch_size: int = 64,
            encoder: Encoder | None = None) -> dict:
    """Median passages/s of the bare encoder and of build_index on the same ``n`` passages."""
    passages = load_corpus(corpus_for("sample"))[:n]
    encoder = encoder or Encoder(batch_size=batch_size)
    texts = [passage_text(p) for p in passages]
    encoder.model.encode(texts[:batch_size], batch_size=batch_size)  # warm-up: load + first-call overhead
    wall: dict[str, list[float]] = {"bare": [], "build": []}
    cpu: dict[str, list[float]] = {"bare": [], "build": []}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(passages, Path(tmp) / "corpus.jsonl")
        for r in range(repeats):
            for kind in ("bare", "build") if r % 2 == 0 else ("build", "bare"):  # alternate to cancel drift
                t0, c0 = time.perf_counter(), time.process_time()
                if kind == "bare":
                    encoder.model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                         show_progress_bar=False)
                else:
                    build_index(corpus, Path(tmp) / f"idx{r}", encoder, index_type, batch_size, progress=False)
                wall[kind].append(len(texts) / (time.perf_counter() - t0))
                cpu[kind].append(len(texts) / (time.process_time() - c0))
        t0 = time.perf_counter()
        build_index(corpus, Path(tmp) / "idx0", encoder, index_type, batch_size, progress=False)
        reuse_s = time.perf_counter() - t0
    b, x = statistics.median(wall["bare"]), statistics.median(wall["build"])
    cpu_ratio = statistics.median(cpu["build"]) / statistics.median(cpu["bare"])
    return {"index": index_type, "passages": len(texts), "repeats": repeats, "batch_size": batch_size,
            "bare_encoder_pps": b, "build_pps": x, "ratio": x / b, "cpu_time_ratio": cpu_ratio, "goal": GOAL,
            "meets_goal": x / b >= GOAL, "reuse_s": reuse_s,
            "bare_runs": [round(v, 2) for v in wall["bare"]], "build_runs": [round(v, 2) for v in wall["build"]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=at_least(1), default=1000,
                    help="passages (the first n of the shipped sample corpus, or all of it)")
    ap.add_argument("--repeats", type=at_least(1), default=3, help="timed runs per side, order alternating")
    ap.add_argument("--index", nargs="+", default=["flat"], choices=["flat", "hnsw"], help="FAISS index types built")
    ap.add_argument("--batch-size", type=at_least(1), default=64, help="encoder batch size")
    args = ap.parse_args(argv)
    encoder = Encoder(batch_size=args.batch_size)
    full = [measure(args.n, args.repeats, t, args.batch_size, encoder) for t in args.index]
    import torch

    meta = {"encoder": encoder.encoder_id, "torch_threads": torch.get_num_threads(), "goal": f">= {GOAL}x bare",
            "runs_pps": {r["index"]: {"bare": r["bare_runs"], "build": r["build_runs"]} for r in full}}
    write_results("index_build", [{k: v for k, v in r.items() if not k.endswith("_runs")} for r in full], meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
