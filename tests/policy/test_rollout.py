"""Batched rollouts with the real default model over the shipped corpus: valid trajectories, GRPO groups,
exact behaviour log-probs, and a Parquet round trip."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ziprl.config import EnvConfig, RetrieverConfig, SamplingConfig
from ziprl.env import SearchCompressEnv
from ziprl.env.trajectory import load_trajectories, save_trajectories
from ziprl.policy import HFEngine
from ziprl.policy.rollout import rollout
from ziprl.retrieval.datasets import load_dataset
from ziprl.retrieval.retriever import Retriever

pytestmark = pytest.mark.slow


class CountingEngine(HFEngine):
    """HFEngine that records the batch size of every generate call."""

    batches: list[int]

    def generate(self, prompts, sampling, seed=None):
        self.batches.append(len(prompts))
        return super().generate(prompts, sampling, seed)


@pytest.fixture(scope="module")
def played(default_model_dir):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # decode steps of a 135M model are tiny: one thread is as fast
    engine = CountingEngine(default_model_dir, device="cpu")
    engine.batches = []
    retriever = Retriever.from_config(RetrieverConfig())
    examples = load_dataset("sample")[:2]
    cfg = EnvConfig(max_turns=3)
    made: list[SearchCompressEnv] = []

    def make_env() -> SearchCompressEnv:
        made.append(SearchCompressEnv(cfg, retriever=retriever, examples=examples))
        return made[-1]

    sampling = SamplingConfig(max_new_tokens=40)
    trajs = rollout(engine, make_env, examples, sampling, group_size=2, seed=5)
    yield engine, examples, made, trajs
    torch.set_num_threads(threads)


def test_groups_and_turns_are_well_formed(played):
    engine, examples, envs, trajs = played
    assert len(trajs) == 4
    assert len(envs) == 4
    assert [t.question_id for t in trajs] == [examples[0].id] * 2 + [examples[1].id] * 2
    assert [t.sample_index for t in trajs] == [0, 1, 0, 1]
    assert trajs[0].group_id == trajs[1].group_id != trajs[2].group_id == trajs[3].group_id
    assert engine.batches[0] == 4  # the first turn of all four episodes is one generation batch
    for tr, env in zip(trajs, envs, strict=True):
        assert env.done
        assert 1 <= len(tr.turns) <= 3
        assert tr.finished == (tr.turns[-1].action == "answer")
        assert tr.finished or len(tr.turns) == 3  # unfinished episodes ran out of turns
        assert tr.reward == (tr.em if tr.finished else 0.0)
        assert tr.policy_version == 0
        for j, turn in enumerate(tr.turns):
            assert 1 <= len(turn.response_ids) <= 40
            assert len(turn.logprobs) == len(turn.response_ids)
            assert all(math.isfinite(x) and x <= 0 for x in turn.logprobs)
            assert turn.prompt_tokens == len(turn.prompt_ids)
            assert turn.response_tokens == len(turn.response_ids)
            assert turn.action in ("search", "open", "answer", "invalid")
            assert (turn.format_error is None) == (turn.action != "invalid")
            if turn.q_com is not None:
                assert 0 <= turn.q_com <= 1
                assert turn.q_ratio is not None
                assert turn.observation_chars > 0
            if j == 0:
                assert turn.q_com is None
                assert turn.observation_chars == 0  # nothing to compress yet
    # the first prompt is exactly the chat-templated reset messages of the env
    first = SearchCompressEnv(EnvConfig(max_turns=3), retriever=envs[0].retriever, examples=examples)
    _, info = first.reset(options={"example": examples[0]})
    assert trajs[0].turns[0].prompt_ids == engine.encode_chat(info["messages"])


def test_behaviour_logprobs_equal_a_teacher_forced_pass(played):
    engine, _, _, trajs = played
    turn = max((t for tr in trajs for t in tr.turns), key=lambda t: len(t.response_ids))
    with torch.inference_mode():
        logits = engine.model(torch.tensor([turn.prompt_ids + turn.response_ids])).logits[0].float()
    n = len(turn.prompt_ids)
    ref = torch.log_softmax(logits[n - 1 : -1], -1).gather(1, torch.tensor(turn.response_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(turn.logprobs), ref, atol=1e-4)


def test_parquet_round_trip_is_lossless(played, tmp_path):
    *_, trajs = played
    path = save_trajectories(trajs, tmp_path / "roll.parquet")
    back = load_trajectories(path)
    assert len(back) == len(trajs)
    assert back == trajs  # log-probs are stored as float32, the precision the engine computes them in
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_loading_a_foreign_parquet_file_names_the_problem(tmp_path):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="not a ZipRL trajectory file"):
        load_trajectories(tmp_path / "other.parquet")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_trajectories(tmp_path / "missing.parquet")
