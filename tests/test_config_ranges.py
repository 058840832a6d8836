"""Values that used to validate and then fail later are rejected by load_config (issue 14, item 6)."""

from __future__ import annotations

import pytest

from tests.conftest import PASSAGES, SizedWordRetriever
from ziprl.config import ConfigError, EnvConfig, load_config
from ziprl.env import SearchCompressEnv


@pytest.mark.parametrize(("override", "needle"), [
    ("env.scoring.w_info=-0.4", "env.scoring weights"),
    ("env.scoring.w_sem=.nan", "env.scoring.w_sem must be a finite number"),
    ("env.scoring.w_ratio=nan", "env.scoring.w_ratio must be a finite number"),
    ("env.scoring.level_scale=inf", "level_scale must be a finite number"),
    ("env.memory_max_chars=-1", "env.memory_max_chars must be >= 0"),
    ("env.max_response_chars=0", "env.max_response_chars must be >="),
    ("learner.lr=-1", "learner.lr must be > 0"),
    ("learner.lr=nan", "learner.lr must be a finite number"),
    ("sft.lr=0", "sft.lr must be > 0"),
    ("run.checkpoint_every=0", "run.checkpoint_every must be >= 1"),
    ("learner.micro_batch_turns=0", "learner.micro_batch_turns"),
    ("learner.micro_batch_tokens=-1", "learner.micro_batch_tokens must be >= 0"),
    ("data.limit=0", "data.limit must be >= 1"),
    ("ray.http_port=70000", "ray.http_port"),
])
def test_out_of_range_values_are_config_errors(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [override])


def test_defaults_and_bounds_still_validate():
    load_config(None, ["env.memory_max_chars=0", "env.scoring.w_level=0", "env.max_response_chars=64"])


def test_top_k_above_the_corpus_size_is_refused_when_the_corpus_is_known():
    retriever = SizedWordRetriever(PASSAGES)
    with pytest.raises(ConfigError, match=r"env.top_k=5 is more than the corpus's 3 passages"):
        SearchCompressEnv(EnvConfig(top_k=5), retriever=retriever)
    with pytest.raises(ConfigError, match="env.memory_max_chars"):
        SearchCompressEnv({"memory_max_chars": -1}, retriever=retriever)
    SearchCompressEnv(EnvConfig(top_k=3), retriever=retriever)
