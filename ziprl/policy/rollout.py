"""Batched agent rollouts: many envs at once, one generation batch per turn across all live episodes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from tqdm import tqdm

from ziprl.config import ConfigError, SamplingConfig, ZipRLConfig
from ziprl.env.group import Group
from ziprl.env.search_env import SearchCompressEnv
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.policy.engine import GenerationEngine
from ziprl.retrieval.types import QAExample

log = logging.getLogger(__name__)


def prompt_token_limit(engine: GenerationEngine, sampling: SamplingConfig) -> int | None:
    """The most prompt tokens a turn may have: the model's context less ``sampling.max_new_tokens`` (None: the
    engine does not know its context); ConfigError when that leaves no room for a prompt."""
    if not engine.max_context:
        return None
    limit = engine.max_context - sampling.max_new_tokens
    if limit < 1:
        raise ConfigError(f"sampling.max_new_tokens={sampling.max_new_tokens} leaves no room for a prompt in the "
                          f"model's {engine.max_context}-token context; lower sampling.max_new_tokens")
    return limit


def rollout(
    engine: GenerationEngine,
    make_env: Callable[[], SearchCompressEnv],
    examples: list[QAExample],
    sampling: SamplingConfig,
    group_size: int = 1,
    seed: int = 0,
    max_batch: int = 64,
    progress: bool = False,
) -> list[Trajectory]:
    """Play ``group_size`` episodes per example; returns one flat list, example by example (``group_size``
    consecutive trajectories per example, sharing a ``group_id``; :func:`rollout_groups` forms the training's groups).

    Every turn, the prompts of all live episodes are generated together (in chunks of ``max_batch``).
    An episode whose prompt exceeds :func:`prompt_token_limit` ends unfinished (context overflow; one warning per
    call counts them), in training and evaluation alike.
    """
    max_prompt_tokens = prompt_token_limit(engine, sampling)
    overflowed = 0
    envs, trajs, infos = [], [], []
    tag = uuid.uuid4().hex[:8]
    for qi, ex in enumerate(examples):
        gid = f"{ex.id}#{tag}.{qi}"  # a batch may hold one question twice (an epoch boundary): two groups
        for s in range(group_size):
            env = make_env()
            _, info = env.reset(seed=seed + qi * group_size + s, options={"example": ex})
            envs.append(env)
            infos.append(info)
            trajs.append(Trajectory(question_id=ex.id, question=ex.question, answers=list(ex.answers), group_id=gid,
                                    sample_index=s, policy_version=engine.version, strategy=env.config.strategy))
    live = list(range(len(envs)))
    bar = tqdm(total=len(envs), desc="episodes", unit="ep", disable=not progress, leave=False)
    step = 0
    while live:
        prompts = {i: engine.encode_chat(infos[i]["messages"]) for i in live}
        if max_prompt_tokens is not None:
            for i in [i for i in live if len(prompts[i]) > max_prompt_tokens]:
                live.remove(i)
                overflowed += 1
                bar.update(1)
        for start in range(0, len(live), max_batch):
            chunk = live[start : start + max_batch]
            gens = engine.generate([prompts[i] for i in chunk], sampling, seed=seed * 100_003 + step * 1_009 + start)
            for i, gen in zip(chunk, gens, strict=True):
                _, reward, terminated, truncated, info = envs[i].step(gen.text)
                trajs[i].turns.append(Turn.from_step(
                    info, prompt_ids=list(gen.prompt_ids), response_ids=list(gen.token_ids), logprobs=list(gen.logprobs),
                    response_text=gen.text, context_chars=infos[i]["context_chars"], prompt_tokens=len(gen.prompt_ids),
                    response_tokens=len(gen.token_ids)))
                infos[i] = info
                if terminated or truncated:
                    tr = trajs[i]
                    tr.reward, tr.finished = reward, terminated
                    tr.em, tr.f1 = info.get("em", 0.0), info.get("f1", 0.0)
        live = [i for i in live if not envs[i].done]
        bar.update(bar.total - bar.n - len(live))
        step += 1
    bar.close()
    if overflowed:
        log.warning("%d of %d episodes ended unfinished: their prompt outgrew the %d tokens the model's context leaves "
                    "beside sampling.max_new_tokens", overflowed, len(envs), max_prompt_tokens)
    return trajs


def rollout_groups(engine: GenerationEngine, make_env: Callable[[], SearchCompressEnv], examples: list[QAExample],
                   cfg: ZipRLConfig, seed: int) -> list[Group]:
    """One GRPO group of G = ``rollout.group_size`` trajectories per example, in order: where training forms its
    groups, and the one place it reads G."""
    g = cfg.rollout.group_size
    trajs = rollout(engine, make_env, examples, cfg.sampling, group_size=g, seed=seed)
    return [Group(tuple(trajs[i * g:(i + 1) * g])) for i in range(len(examples))]
