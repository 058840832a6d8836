"""RLlib adapter: a fixed-shape view of SearchCompressEnv for RL libraries that cannot train on text spaces.

:class:`TokenizedSearchCompressEnv` observes the token ids of the rendered chat prompt and acts by
choosing one of ``n`` candidate turns::

    observation  Dict(tokens=Box(0, vocab-1, (max_len,), int64), mask=Box(0, 1, (max_len,), int8))
    action       Discrete(n): index into the candidates a :class:`CandidateGenerator` wrote for this turn

The prompt keeps its newest ``max_len`` tokens (left truncation), right-padded with ``pad_id`` and a
0 mask. Reward, termination and info are the wrapped env's; info adds ``candidates`` (the choices for the
next action) and, after a step, ``response`` (the chosen turn). Candidate selection is the only action
mode: token-by-token generation of turns is what ``ziprl.policy`` does against the text env directly.
Nothing here imports torch or ray; a tokenizer (an HF tokenizer, or any object with ``encode``, or a
callable text -> ids) is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from ziprl.config import DataConfig, ModelConfig, from_dict
from ziprl.env.chat import chat_ids
from ziprl.env.protocol import HIT_LINE_RE, escape
from ziprl.env.scripted import extractive_note
from ziprl.env.search_env import SearchCompressEnv, render_messages
from ziprl.scoring.levels import level_spec

CONFIG_KEYS = ("env", "retriever", "data", "max_len", "num_candidates", "levels", "tokenizer", "vocab_size")


class CandidateGenerator(Protocol):
    """Writes the candidate turns of the current step: ``candidates(env)`` returns exactly n well-formed turns."""

    def candidates(self, env: SearchCompressEnv) -> list[str]: ...


class HeuristicCandidates:
    """Deterministic candidates read off the current observation (never the gold answer).

    Actions: every registered tool's candidate arguments (:meth:`ziprl.env.tools.Tool.candidates`), interleaved
    in registry order; the built-in ones search the question and each capitalised phrase of it (not searched
    yet), open each doc id of pending search results (not opened yet), answer with spans of the pending
    observation and memory. Each action first appears with a ``levels[0]`` note, then with the next levels,
    until ``n``; the list is padded with repeats. A note is an extractive compression of the
    pending observation within the level's character range (a one-line plan when nothing is pending).
    """

    def __init__(self, n: int = 8, levels: Sequence[int] = (1, 3)):
        if n < 1:
            raise ValueError(f"num_candidates must be >= 1, got {n}")
        if not levels or any(not 1 <= g <= 5 for g in levels):
            raise ValueError(f"levels must be a non-empty list of integers 1..5, got {list(levels)}")
        self.n, self.levels = n, tuple(levels)

    def actions(self, env: SearchCompressEnv) -> list[str]:
        """The distinct action tags, interleaved by tool; searching the question again when no tool offers one."""
        kinds = [[f"<{name}>{escape(a)}</{name}>" for a in tool.candidates(env)] for name, tool in env.tools.items()]
        interleaved = [k[i] for i in range(max(map(len, kinds))) for k in kinds if i < len(k)]
        return interleaved or [f"<search>{escape(env.example.question)}</search>"]

    def notes(self, env: SearchCompressEnv) -> list[tuple[int, str]]:
        """(level, note) pairs, one per distinct level the env will score."""
        question, cfg, pending = env.example.question, env.config, env.context.pending
        if pending is None:
            return [(self.levels[0], f"I need to find: {question}")]
        levels = (env.strategy.fixed_level,) if env.strategy.fixed_level else self.levels
        text = HIT_LINE_RE.sub(r"\2:", pending.text)  # "‣ [doc-id] Title" headers read as "Title:"
        out = []
        for g in levels:
            spec = level_spec(g, cfg.scoring.level_scale)
            out.append((g, extractive_note(question, [], text, spec.char_low, spec.char_high)))
        return out

    def candidates(self, env: SearchCompressEnv) -> list[str]:
        actions = self.actions(env)
        turns = [f'<compress level="{g}">{escape(note)}</compress>\n{a}' for g, note in self.notes(env) for a in actions]
        return [turns[i % len(turns)] for i in range(self.n)]


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat prompt: the tokenizer's chat template if it has one, else its encoding of the text."""
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template"):
        return chat_ids(tokenizer, messages)  # special-token text in a message stays plain text
    text = render_messages(messages)
    if hasattr(tokenizer, "encode"):
        return list(tokenizer.encode(text))
    if callable(tokenizer):
        return list(tokenizer(text))
    raise TypeError(f"tokenizer must have encode() or be a callable text -> ids, got {type(tokenizer).__name__}")


def _vocab_size(tokenizer: Any) -> int:
    if hasattr(tokenizer, "__len__"):
        return len(tokenizer)  # HF: includes added special tokens
    if isinstance(getattr(tokenizer, "vocab_size", None), int):
        return tokenizer.vocab_size
    raise ValueError("cannot tell the tokenizer's vocabulary size: pass vocab_size=")


class TokenizedSearchCompressEnv(gym.Wrapper):
    """SearchCompressEnv with token-id observations and a Discrete choice among candidate turns."""

    def __init__(self, env: gym.Env, tokenizer: Any, max_len: int = 1024, num_candidates: int = 8,
                 candidates: CandidateGenerator | None = None, vocab_size: int | None = None, pad_id: int = 0):
        super().__init__(env)
        if not isinstance(env.unwrapped, SearchCompressEnv):
            raise TypeError(f"TokenizedSearchCompressEnv wraps a SearchCompressEnv, got {type(env.unwrapped).__name__}")
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.tokenizer, self.max_len, self.num_candidates = tokenizer, max_len, num_candidates
        self.generator = candidates or HeuristicCandidates(num_candidates)
        self.vocab_size = vocab_size or _vocab_size(tokenizer)
        if not 0 <= pad_id < self.vocab_size:
            raise ValueError(f"pad_id {pad_id} is outside the vocabulary [0, {self.vocab_size})")
        self.pad_id = pad_id
        self.observation_space = gym.spaces.Dict({
            "tokens": gym.spaces.Box(0, self.vocab_size - 1, (max_len,), np.int64),
            "mask": gym.spaces.Box(0, 1, (max_len,), np.int8),
        })
        self.action_space = gym.spaces.Discrete(num_candidates)
        self.candidates: list[str] = []

    def encode(self, messages: list[dict[str, str]]) -> dict[str, np.ndarray]:
        """The observation for ``messages``: the newest max_len token ids, right-padded, and their mask."""
        ids = encode_messages(self.tokenizer, messages)[-self.max_len :]
        if ids and not 0 <= min(ids) <= max(ids) < self.vocab_size:
            raise ValueError(f"token id outside [0, {self.vocab_size}): pass the tokenizer's true vocab_size")
        tokens = np.full(self.max_len, self.pad_id, np.int64)
        mask = np.zeros(self.max_len, np.int8)
        tokens[: len(ids)], mask[: len(ids)] = ids, 1
        return {"tokens": tokens, "mask": mask}

    def _refresh(self) -> list[str]:
        env = self.env.unwrapped
        self.candidates = [] if env.done else list(self.generator.candidates(env))
        if not env.done and len(self.candidates) != self.num_candidates:
            raise ValueError(f"the candidate generator returned {len(self.candidates)} turns; "
                             f"num_candidates is {self.num_candidates}")
        return self.candidates

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        return self.encode(info["messages"]), {**info, "candidates": self._refresh()}

    def step(self, action: int):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an integer in [0, {self.num_candidates}), got {action!r}")
        if self.env.unwrapped.done:
            raise RuntimeError("the episode is over (or never started): call reset() before step()")
        response = self.candidates[int(action)]
        _, reward, terminated, truncated, info = self.env.step(response)
        info = {**info, "response": response, "candidates": self._refresh()}
        return self.encode(info["messages"]), reward, terminated, truncated, info


@lru_cache(maxsize=4)
def _cached_tokenizer(path: str | None) -> Any:
    """A local tokenizer directory's tokenizer, or the embedded policy's (loaded once per process)."""
    from ziprl.policy.models import load_tokenizer, resolve_model_path  # loads transformers: import lazily

    return load_tokenizer(path if path is not None else resolve_model_path(ModelConfig()))


def make_tokenized_env(config: dict[str, Any] | None = None) -> TokenizedSearchCompressEnv:
    """Env creator for ``ray.tune.register_env`` (takes RLlib's EnvContext or a plain dict).

    Keys (all optional): ``env`` (EnvConfig dict), ``retriever`` (RetrieverConfig dict; default the shipped
    sample index), ``data`` (DataConfig dict; default the shipped sample questions), ``max_len`` (1024),
    ``num_candidates`` (8), ``levels`` ([1, 3]), ``tokenizer`` (local HF tokenizer/model directory; default
    the embedded policy's tokenizer), ``vocab_size`` (default the tokenizer's).
    """
    config = dict(config or {})
    unknown = set(config) - set(CONFIG_KEYS)
    if unknown:
        raise ValueError(f"unknown tokenized-env config key(s) {sorted(unknown)}; known: {list(CONFIG_KEYS)}")
    examples = None
    if config.get("data") is not None:
        from ziprl.retrieval.datasets import load_questions

        examples = load_questions(from_dict(DataConfig, config["data"], "data"))
    env = SearchCompressEnv(config=config.get("env"), retriever_config=config.get("retriever"), examples=examples)
    n = int(config.get("num_candidates", 8))
    return TokenizedSearchCompressEnv(
        env, _cached_tokenizer(config.get("tokenizer")), max_len=int(config.get("max_len", 1024)), num_candidates=n,
        candidates=HeuristicCandidates(n, tuple(config.get("levels", (1, 3)))), vocab_size=config.get("vocab_size"),
    )

