"""`env.step` never raises for any str (full Unicode, lone surrogates included); levels are ASCII 1-5 only."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ziprl.config import EnvConfig, RetrieverConfig
from ziprl.env import SearchCompressEnv
from ziprl.env.protocol import parse_turn
from ziprl.registry import STRATEGIES as REGISTERED
from ziprl.retrieval.retriever import Retriever
from ziprl.retrieval.types import QAExample
from ziprl.testing.fuzz_strategies import turns
from ziprl.testing.word_retriever import PASSAGES, WordRetriever

EX = QAExample("q", "What is the capital of France?", ["Paris"])
STRATEGIES = REGISTERED.names()  # every registered strategy, plug-ins included


@pytest.fixture(scope="module")
def retriever() -> Retriever:
    return Retriever.from_config(RetrieverConfig())  # the shipped sample index: real FAISS, real encoder


def check_step(env: SearchCompressEnv, text: str) -> None:
    """One step's promises: no exception, a UTF-8-encodable observation, a level only when it is 1..5."""
    obs, reward, term, trunc, info = env.step(text)
    obs.encode("utf-8")  # no lone surrogate reaches the observation (or a tokenizer)
    assert 0.0 <= reward <= 1.0
    assert isinstance(term, bool)
    assert isinstance(trunc, bool)
    assert info["level"] is None or info["level"] in range(1, 6)
    assert (info["format_error"] is None) == (info["action"] != "invalid")


@pytest.mark.parametrize("level", ["²", "３", "٣", "𝟑", "①", "3\u0663", "\x1c1", "\u20031"])
def test_non_ascii_digit_levels_are_format_errors(level):
    parsed = parse_turn(f'<compress level="{level}">note</compress><answer>x</answer>')
    assert parsed.level is None
    assert "ASCII digit from 1 to 5" in parsed.error


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lone_surrogates_reach_no_tokenizer(strategy, retriever):
    env = SearchCompressEnv(EnvConfig(strategy=strategy), retriever=retriever, examples=[EX])
    env.reset(seed=0)
    obs, _, _, _, info = env.step('<compress level="1">plan \ud800</compress><search>Paris \udc00 France</search>')
    assert info["tool_error"] is None
    assert info["format_error"] is None
    assert info["action"] == "search"
    obs.encode("utf-8")
    _, _, _, _, info = env.step('<compress level="2">x \udfff</compress><open>\ud83d</open>')
    assert info["tool_error"] is not None  # an unknown id is an observation for the agent


@settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(STRATEGIES), st.lists(turns, min_size=1, max_size=3))
def test_step_never_raises_for_any_text(strategy, texts):
    """~3,000 turns here (a word retriever, for speed); benchmarks/fuzz_env.py plays 100,000 on the real index."""
    env = SearchCompressEnv(EnvConfig(strategy=strategy, max_turns=4), retriever=WordRetriever(PASSAGES), examples=[EX])
    env.reset(seed=0)
    for text in texts:
        check_step(env, text)
        if env.done:
            break
