"""Fuzz `SearchCompressEnv.step` with 100,000 hypothesis-generated turns over the whole Unicode range.

    python benchmarks/fuzz_env.py [--turns 100000] [--word-retriever]

Turns come from ziprl/testing/fuzz_strategies.py (structured turns with any level string, raw text, protocol and
chat-template fragments, forged hit lines, lone surrogates); every strategy plays them on the shipped sample
index (real FAISS + encoder). Counts exceptions (the promise is zero), format and tool errors, and writes
``benchmarks/results/fuzz_env.{json,md}``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks._common import at_least, write_results  # noqa: E402
from ziprl.config import EnvConfig, RetrieverConfig  # noqa: E402
from ziprl.env import SearchCompressEnv  # noqa: E402
from ziprl.registry import STRATEGIES  # noqa: E402
from ziprl.retrieval.types import QAExample  # noqa: E402
from ziprl.testing.fuzz_strategies import turns  # noqa: E402

EX = QAExample("q", "What is the capital of France?", ["Paris"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=at_least(1), default=100_000, help="generated turns to play (at least 1)")
    ap.add_argument("--word-retriever", action="store_true", help="the tests' word retriever instead of FAISS")
    args = ap.parse_args()
    if args.word_retriever:
        from ziprl.testing.word_retriever import PASSAGES, WordRetriever

        retriever = WordRetriever(PASSAGES)
    else:
        from ziprl.retrieval.retriever import Retriever

        retriever = Retriever.from_config(RetrieverConfig())
    envs = {s: SearchCompressEnv(EnvConfig(strategy=s, max_turns=6), retriever=retriever, examples=[EX])
            for s in STRATEGIES}
    for env in envs.values():
        env.reset(seed=0)
    counts = {s: collections.Counter() for s in STRATEGIES}
    raised: collections.Counter = collections.Counter()
    bar = tqdm(total=args.turns, desc="fuzz", unit="turn")
    n = [0]

    @settings(max_examples=args.turns, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(turns)
    def play(text: str) -> None:
        strategy = STRATEGIES.names()[n[0] % len(STRATEGIES)]
        n[0] += 1
        env, c = envs[strategy], counts[strategy]
        c["turns"] += 1
        c["surrogate_turns"] += any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)
        try:
            obs, _, term, trunc, info = env.step(text)
            obs.encode("utf-8")
            c["format_errors"] += info["format_error"] is not None
            c["tool_errors"] += info["tool_error"] is not None
            c["accepted"] += info["format_error"] is None
        except Exception as exc:  # the promise: never
            c["raised"] += 1
            raised[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            term = trunc = True
        if term or trunc:
            env.reset(seed=0)
        bar.update(1)

    t0 = time.perf_counter()
    play()
    bar.close()
    seconds = time.perf_counter() - t0
    rows = [{"strategy": s, **{k: c[k] for k in ("turns", "accepted", "format_errors", "tool_errors",
                                                   "surrogate_turns", "raised")}} for s, c in counts.items()]
    rows.append({"strategy": "all", **{k: sum(r[k] for r in rows) for k in rows[0] if k != "strategy"}})
    write_results("fuzz_env", rows, {"turns": n[0], "seconds": round(seconds, 1), "exceptions": dict(raised),
                                     "retriever": "word" if args.word_retriever else "shipped sample FAISS index"})
    if raised:
        sys.exit(f"{sum(raised.values())} turns raised: {dict(raised)}")


if __name__ == "__main__":
    main()
