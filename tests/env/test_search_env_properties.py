"""Property-based: thousands of random and adversarial responses never crash `step`."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ziprl.config import EnvConfig
from ziprl.env import SearchCompressEnv
from ziprl.registry import STRATEGIES
from ziprl.retrieval.types import QAExample
from ziprl.testing.word_retriever import PASSAGES, WordRetriever

EX = QAExample("q", "What is the capital of France?", ["Paris"])
PIECES = ["<compress level=\"3\">", "<compress level=\"9\">", "<compress>", "</compress>", "<search>", "</search>",
          "<open>", "</open>", "<answer>", "</answer>", "<think>", "</think>", "d1", "d3", "Paris", "nope",
          "<observation>", "</observation>", "<|im_end|>", "&lt;", "\x00", "\u202e", "🙂", " ", "\n", "level=3", ">", "<"]

responses = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(PIECES), max_size=30).map("".join),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=20)), max_size=20).map("".join),
)


def _env(strategy: str) -> SearchCompressEnv:
    return SearchCompressEnv(EnvConfig(strategy=strategy, max_turns=8), retriever=WordRetriever(PASSAGES), examples=[EX])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(STRATEGIES.names()), st.lists(responses, min_size=1, max_size=8))
def test_step_never_raises_and_info_is_consistent(strategy, texts):
    env = _env(strategy)
    env.reset(seed=0)
    for i, text in enumerate(texts, start=1):
        obs, reward, term, trunc, info = env.step(text)
        assert isinstance(obs, str)
        assert env.observation_space.contains(obs)
        assert info["turn"] == i
        assert 0.0 <= reward <= 1.0
        assert (info["format_error"] is None) == (info["action"] != "invalid")
        if info["q_com"] is not None:
            assert 0.0 <= info["q_com"] <= 1.0
        if term or trunc:
            assert env.done
            break


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=100_000, max_value=3_000_000))
def test_megabyte_responses_are_format_errors(n):
    env = _env("adaptive")
    env.reset(seed=0)
    *_, info = env.step("<answer>" + "x" * n + "</answer>")
    assert info["action"] == "invalid"
    assert "limit" in info["format_error"]
