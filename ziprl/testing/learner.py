"""The trainer tests' inputs: learner settings over the defaults, multi-turn groups with real chat-template prompts
and behaviour log-probs from the model, and the DeepSpeed skip mark."""

from __future__ import annotations

import functools
import importlib.util
import random
from pathlib import Path

import pytest
import torch

from ziprl.config import ZipRLConfig
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.learner.sft import chat_prompt_ids, end_of_turn_ids
from ziprl.policy.models import load_model, load_tokenizer

requires_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                        reason="the trainer needs DeepSpeed: pip install 'ziprl[deepspeed]'")


def make_cfg(**learner) -> ZipRLConfig:
    """Learner settings over the defaults; float32 unless ``bf16`` is given (the exactness tests compare float32)."""
    cfg = ZipRLConfig()
    for key, value in {"bf16": False, **learner}.items():
        setattr(cfg.learner, key, value)
    return cfg


@torch.no_grad()
def behaviour_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


@functools.cache
def model_and_tokenizer(model_dir: Path):
    return load_model(model_dir), load_tokenizer(model_dir)


def make_groups(model_dir: Path, groups: int, group_size: int, max_turns: int, seed: int = 0,
                logprob_noise: float = 0.0) -> list[Group]:
    """``groups`` groups of multi-turn trajectories with real chat-template prompts, tag-protocol responses and
    behaviour log-probs from a forward pass of the model (rho = 1 at the start unless ``logprob_noise`` perturbs
    them)."""
    rng = random.Random(seed)
    model, tok = model_and_tokenizer(model_dir)
    eot = end_of_turn_ids(tok)
    out = []
    for g in range(groups):
        members = []
        for i in range(group_size):
            turns = []
            for j in range(1 + (i + g) % max_turns):
                prompt = chat_prompt_ids(tok, [{"role": "user", "content": f"Question {g}: who wrote book {j}?"}])
                text = f'<compress level="{1 + (i + j) % 5}">doc {i} says author {rng.randint(0, 99)}</compress>'
                text += "<answer>Ann</answer>" if j == (i + g) % max_turns else f"<search>book {j} author</search>"
                response = tok(text, add_special_tokens=False)["input_ids"] + eot
                lp = [x - logprob_noise * rng.random() for x in behaviour_logprobs(model, prompt, response)]
                turns.append(Turn(prompt_ids=prompt, response_ids=response, logprobs=lp, response_text=text,
                                  q_com=rng.random() if j else None))
            members.append(Trajectory(question_id=f"q{g}", question=f"Question {g}", answers=["Ann"],
                                      group_id=f"g{g}", sample_index=i, reward=float((i + g) % 2), turns=turns))
        out.append(Group(tuple(members)))
    return out
