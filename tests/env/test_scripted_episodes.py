"""Whole episodes over the real shipped corpus and a real FAISS index, played by the scripted teacher."""

from __future__ import annotations

import pytest

from ziprl.config import EnvConfig, RetrieverConfig, ScoringConfig
from ziprl.env import SearchCompressEnv
from ziprl.env.scripted import ScriptedTeacher
from ziprl.retrieval.datasets import load_dataset
from ziprl.retrieval.retriever import Retriever


@pytest.fixture(scope="module")
def retriever():
    return Retriever.from_config(RetrieverConfig())


@pytest.fixture(scope="module")
def examples():
    return load_dataset("sample")[:8]


@pytest.mark.parametrize("strategy", ["adaptive", "uniform"])
def test_scripted_episodes_score_every_compression(retriever, examples, strategy):
    env = SearchCompressEnv(EnvConfig(strategy=strategy, max_turns=16, memory_max_chars=3000,
                                      scoring=ScoringConfig(level_scale=0.5)), retriever=retriever, examples=examples)
    teacher = ScriptedTeacher()
    found = wanted = 0
    for i, ex in enumerate(examples):
        env.reset(options={"index": i})
        infos, done = [], False
        while not done:
            _, reward, term, trunc, info = env.step(teacher.respond(env))
            infos.append(info)
            done = term or trunc
            assert sum(len(n.text) for n in env.context.memory) <= 3000
        assert term, ex.question
        assert reward == 1.0, ex.question
        assert infos[-1]["em"] == 1.0, ex.question
        assert all(x["format_error"] is None and x["tool_error"] is None for x in infos)
        scored = [x for x in infos if x["observation_chars"] > 0]
        assert len(scored) == len(infos) - 1  # every turn after the first compressed an observation
        assert all(0 < x["q_com"] <= 1 for x in scored)
        opened = {x["argument"] for x in infos if x["action"] == "open"}
        titles = {retriever.open(d).title for d in opened}
        assert titles & set(ex.supporting_titles), "at least one supporting passage found through search"
        found += len(titles & set(ex.supporting_titles))
        wanted += len(set(ex.supporting_titles))
    assert found / wanted >= 0.75, f"supporting-passage recall through the real index {found}/{wanted}"
