"""Memory stays bounded for every strategy: 300 turns of 1 MB responses (rejected as over-limit)."""

from __future__ import annotations

import tracemalloc

import pytest

from ziprl.config import EnvConfig
from ziprl.env import SearchCompressEnv
from ziprl.env.strategies.react import REJECTED_KEEP
from ziprl.registry import STRATEGIES
from ziprl.retrieval.types import QAExample
from ziprl.testing.word_retriever import PASSAGES, WordRetriever

TURNS, RESPONSE = 300, 1 << 20
BOUND = 16 << 20  # peak growth over 300 turns: a few MB (react's history of cut responses), far below 300 MB


@pytest.mark.parametrize("strategy", STRATEGIES.names())
def test_300_one_megabyte_turns_stay_bounded(strategy):
    env = SearchCompressEnv(EnvConfig(strategy=strategy, max_turns=TURNS + 1), retriever=WordRetriever(PASSAGES),
                            examples=[QAExample("q", "What is the capital of France?", ["Paris"])])
    env.reset(seed=0)
    env.step('<compress level="1">plan</compress><search>Paris</search>')
    big = '<compress level="2">' + "x" * RESPONSE + "</compress><answer>Paris</answer>"
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(TURNS):
            obs, _, term, _, info = env.step(big)
            assert not term
            assert "the limit is" in info["format_error"]
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < BOUND, f"{strategy}: peak grew by {peak / 2**20:.1f} MiB"
    assert len(obs) < TURNS * (REJECTED_KEEP + 500) + 20_000
    if strategy == "react":
        kept = env.context.history[-1][0]
        assert len(kept) < REJECTED_KEEP + 100
        assert kept.endswith("more characters cut]")
