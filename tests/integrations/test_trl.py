"""TRL's GRPOTrainer trains a policy on SearchCompressEnv through ziprl.integrations.trl's rollout_func."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from ziprl.config import SamplingConfig
from ziprl.env.search_env import SearchCompressEnv
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.integrations import trl as ziprl_trl
from ziprl.integrations.trl import SearchCompressRollout, flatten, prompt_dataset, q_com_reward
from ziprl.retrieval.types import QAExample
from ziprl.testing.word_retriever import PASSAGES, WordRetriever

EXAMPLE = QAExample("q-paris", "What is the capital of France?", ["Paris"])
ANSWERS = ("<answer>Paris</answer>", "<answer>Rome</answer>")


def test_flatten_masks_env_tokens():
    """Grown context (react): only the new tokens; rewritten context: the turn's prompt after the system prefix."""
    grown = Trajectory("q", "Q", ["a"], turns=[Turn(prompt_ids=[1, 2, 3], response_ids=[4, 5], logprobs=[-1.0, -2.0]),
                                               Turn(prompt_ids=[1, 2, 3, 4, 5, 6, 7], response_ids=[8], logprobs=[-3.0])])
    assert flatten(grown, [1]) == ([1, 2, 3], [4, 5, 6, 7, 8], [1, 1, 0, 0, 1], [-1.0, -2.0, 0.0, 0.0, -3.0])
    rewritten = Trajectory("q", "Q", ["a"], turns=[Turn(prompt_ids=[1, 2, 3], response_ids=[4], logprobs=[-1.0]),
                                                   Turn(prompt_ids=[1, 2, 9, 9], response_ids=[5], logprobs=[-2.0])])
    assert flatten(rewritten, [1, 2]) == ([1, 2, 3], [4, 9, 9, 5], [1, 0, 0, 1], [-1.0, 0.0, 0.0, -2.0])


@pytest.fixture(scope="module")
def coin_policy(default_model_dir):
    """A 2-layer Llama (SmolLM2's tokenizer) wired as a bigram model that answers 'Paris' or 'Rome', 50/50.

    Every layer's output projection is zeroed, so the last hidden state is the current token's embedding;
    the involved tokens get orthogonal embeddings and the untied LM head maps each to its successor in
    the two answers. Sampling then yields well-formed answers whose env rewards differ (1 or 0).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ziprl.env.chat import chat_ids
    from ziprl.policy.models import load_tokenizer

    tok = load_tokenizer(default_model_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    env = SearchCompressEnv({"strategy": "react", "max_turns": 1}, retriever=WordRetriever(PASSAGES))
    _, info = env.reset(options={"example": EXAMPLE})
    start = chat_ids(tok, info["messages"])[-1]
    chains = [[start, *tok.encode(a, add_special_tokens=False)] for a in ANSWERS]
    pairs = {(u, v) for chain in chains for u, v in zip(chain, chain[1:], strict=False)}
    tokens = sorted({t for chain in chains for t in chain})
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for i, t in enumerate(tokens):
            model.model.embed_tokens.weight[t] = torch.nn.functional.one_hot(torch.tensor(i), 64).float()
        for u, v in pairs:
            model.lm_head.weight[v] += 3.0 * model.model.embed_tokens.weight[u]
    return model, tok


@pytest.mark.slow
def test_grpo_trainer_step_on_the_env(coin_policy, tmp_path, monkeypatch):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tok = coin_policy
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    retriever = WordRetriever(PASSAGES)
    rollout = SearchCompressRollout(
        lambda: SearchCompressEnv({"strategy": "react", "max_turns": 1, "reward": "em"}, retriever=retriever),
        [EXAMPLE], SamplingConfig(temperature=1.0, max_new_tokens=16), save_dir=tmp_path / "run")
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=8, max_steps=1,
                      learning_rate=1e-3, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
                      max_completion_length=128, temperature=1.0, beta=0.0, seed=0, bf16=False)
    rewards_seen = []

    def recorded_env_reward(completions, env_reward, **kwargs):
        rewards_seen.append(list(env_reward))
        return ziprl_trl.env_reward(completions, env_reward)

    trainer = GRPOTrainer(model=model, reward_funcs=[recorded_env_reward, q_com_reward], args=args,
                          train_dataset=prompt_dataset([EXAMPLE] * 8), processing_class=tok,
                          rollout_func=rollout)
    trainer.train()
    trajs = rollout.last_trajectories
    assert rollout.env_steps == sum(len(t.turns) for t in trajs) >= 8  # every prompt's episode was stepped
    assert rewards_seen == [[t.reward for t in trajs]]  # TRL's rewards are the env's
    assert {0.0, 1.0} <= set(rewards_seen[0])  # both answers were sampled, so advantages are non-zero
    assert (tmp_path / "run" / "trajectories" / "step_000001.parquet").is_file()
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert changed, "GRPOTrainer did not change any weight"


def _example(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``examples/trl_grpo.py`` run with ``args`` in ``tmp_path`` (its own empty cache)."""
    env = {**os.environ, "ZIPRL_CACHE": str(tmp_path / "cache"), "TRL_EXPERIMENTAL_SILENCE": "1"}
    return subprocess.run([sys.executable, str(REPO / "examples" / "trl_grpo.py"), *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)


def _one_error(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, run.stderr
    assert "Traceback" not in run.stderr
    return errors[0]


def _listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(("args", "says"), [
    (["--questions", "0"], "--questions: '0': must be at least 1"),
    (["--steps", "0"], "--steps: '0': must be at least 1"),
    (["--steps", "-1"], "--steps: '-1': must be at least 1"),
    (["--generations", "1"], "--generations: '1': must be at least 2"),
    (["--strategy", "bogus"], "invalid choice: 'bogus'"),
    (["--model", "/nonexistent/model"], "is not a local directory"),
])
def test_the_trl_example_refuses_bad_arguments_before_anything_loads_or_is_written(tmp_path, args, says):
    assert says in _one_error(_example(tmp_path, *args, "--out", str(tmp_path / "out")))
    assert _listing(tmp_path) == []


def test_the_trl_example_refuses_an_out_directory_it_did_not_write(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "trajectories").mkdir(parents=True)
    (run_dir / "trajectories" / "step_000001.parquet").write_bytes(b"a ziprl.train run's trajectories")
    (tmp_path / "afile").write_text("keep me")
    before = _listing(tmp_path)
    err = _one_error(_example(tmp_path, "--out", str(run_dir)))
    assert "examples/trl_grpo.py's output directory" in err
    assert "choose another --out" in err
    assert "exists and is not a directory" in _one_error(_example(tmp_path, "--out", str(tmp_path / "afile")))
    assert _listing(tmp_path) == before
    assert (run_dir / "trajectories" / "step_000001.parquet").read_bytes() == b"a ziprl.train run's trajectories"
    assert (tmp_path / "afile").read_text() == "keep me"
