"""The ``window`` strategy (one plug-in file): the last k raw observations, older ones dropped, no compression."""

from __future__ import annotations

import pytest

from ziprl.config import ConfigError, EnvConfig, load_config
from ziprl.env import SearchCompressEnv
from ziprl.env.scripted import ScriptedTeacher
from ziprl.integrations.rllib import TokenizedSearchCompressEnv
from ziprl.registry import STRATEGIES
from ziprl.retrieval.types import QAExample
from ziprl.testing.byte_tokenizer import ByteTokenizer
from ziprl.testing.word_retriever import PASSAGES, WordRetriever

EX = QAExample("q1", "Were Scott Derrickson and Ed Wood of the same nationality?", ["yes"], ["Scott Derrickson", "Ed Wood"])
OPENS = ["d1", "d2", "d3", "d1"]  # four observations, each a whole passage


def make(**kw) -> SearchCompressEnv:
    return SearchCompressEnv(EnvConfig(strategy="window", **kw), retriever=WordRetriever(PASSAGES), examples=[EX])


def test_registered_with_a_config_default():
    assert "window" in STRATEGIES
    assert not STRATEGIES["window"].compresses
    assert EnvConfig().window_size == 3
    assert load_config(None, ["env.strategy=window"]).env.strategy == "window"
    with pytest.raises(ConfigError, match="env.window_size must be >= 1"):
        load_config(None, ["env.window_size=0"])


def test_the_context_holds_exactly_the_last_k_raw_observations(monkeypatch):
    import ziprl.env.search_env as search_env

    def never(*args, **kwargs):
        raise AssertionError("window never compresses")

    monkeypatch.setattr(search_env, "compression_quality", never)
    env = make(window_size=2, max_turns=10)
    obs, _ = env.reset(seed=0)
    assert "last 2 observations in full" in env.system
    assert "<compress" not in env.system
    for turn, doc in enumerate(OPENS, 1):
        obs, _, _, _, info = env.step(f"<think>read {doc}</think><open>{doc}</open>")
        assert info["format_error"] is None
        assert info["q_com"] is None
        assert info["level"] is None
        assert obs.count("<observation>") == min(turn, 2)
    kept = [o.label for o in env.context.kept]
    assert kept == ["open d3", "open d1"]
    assert env.context.pending.label == "open d1"
    assert "(2 older observations dropped)" in obs
    assert "Edward Davis Wood" not in obs  # d2 fell out of the window
    assert obs.index("OBSERVATION (turn 3, open d3)") < obs.index("OBSERVATION (turn 4, open d1)")
    *_, info = env.step("<search>Paris</search><answer>x</answer>")  # rejected: the window stays as it was
    assert info["format_error"]
    assert [o.label for o in env.context.kept] == kept
    obs, *_ = env.step("<answer>Paris</answer>")
    assert obs.count("<observation>") == 2  # after the last turn the window still shows the last two


def test_default_window_of_three_with_tool_errors():
    env = make(max_turns=10)
    env.reset(seed=0)
    for doc in [*OPENS, "nope"]:
        obs, *_, info = env.step(f"<open>{doc}</open>")
    assert "no document with id 'nope'" in info["tool_error"]
    assert obs.count("<observation>") == 3
    assert env.context.pending is None
    assert len(env.context.kept) == 3


def test_scripted_teacher_solves_under_window():
    env = make(max_turns=8)
    teacher, done = ScriptedTeacher(), False
    env.reset(seed=0)
    while not done:
        _, reward, term, trunc, info = env.step(teacher.respond(env))
        done = term or trunc
    assert term
    assert reward == 1.0
    assert info["em"] == 1.0


def test_tokenized_env_runs_under_window():
    env = TokenizedSearchCompressEnv(make(max_turns=4, window_size=1), ByteTokenizer(), max_len=256, num_candidates=4)
    obs, info = env.reset(seed=0)
    done = False
    while not done:
        obs, _, term, trunc, info = env.step(0)
        assert info["format_error"] is None
        assert obs["tokens"].shape == (256,)
        done = term or trunc
    assert len(env.unwrapped.context.kept) <= 1
