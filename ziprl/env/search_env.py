"""SearchCompressEnv: a gymnasium env where an LLM agent searches, opens pages, compresses and answers."""

from __future__ import annotations

import dataclasses
import string
from typing import Any

import gymnasium as gym

from ziprl.config import EnvConfig, RetrieverConfig, ZipRLConfig, check_top_k, from_dict
from ziprl.env.context import ContextState, Strategy
from ziprl.env.protocol import ParsedTurn, parse_turn, scrub, unescape
from ziprl.env.tools import Tool, ToolResult
from ziprl.registry import STRATEGIES, TOOLS
from ziprl.retrieval.noise import check_noise_retriever, noise_rng
from ziprl.retrieval.types import QAExample, RetrieverLike
from ziprl.scoring import CompressionScore, compression_quality

MAX_TEXT = 10_000_000
_ZERO = CompressionScore(ratio=0.0, level=0.0, info=0.0, sem=0.0, total=0.0)


class UnicodeText(gym.spaces.Text):
    """A Text space that holds any unicode string (gymnasium's default charset rejects ordinary sentences)."""

    def __init__(self, max_length: int = MAX_TEXT):
        super().__init__(max_length=max_length, min_length=0, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


def render_messages(messages: list[dict[str, str]]) -> str:
    """Plain-text view of chat messages (the gymnasium observation)."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def _as_example(obj: Any) -> QAExample:
    if isinstance(obj, QAExample):
        return obj
    if isinstance(obj, dict) and {"question", "answers"} <= obj.keys():
        answers = obj["answers"] if isinstance(obj["answers"], list) else [obj["answers"]]
        return QAExample(id=str(obj.get("id", "custom")), question=str(obj["question"]), answers=[str(a) for a in answers],
                         supporting_titles=list(obj.get("supporting_titles", [])), source=str(obj.get("source", "")))
    raise ValueError("options['example'] must be a QAExample or a dict with 'question' and 'answers'")


class SearchCompressEnv(gym.Env):
    """One question per episode; each step takes one assistant turn (text) and returns the next prompt.

    Reward is 0 until ``<answer>``, then the outcome reward ``config.reward`` (EM, F1, ...) against the gold
    answers. The context strategy (``config.strategy``) and the tools come from :mod:`ziprl.registry`.
    ``info`` carries the turn's action, level, Q_com and its parts, errors, sizes and the next chat ``messages``;
    the rollout records every ``step`` field of :class:`ziprl.env.trajectory.Turn` from it, by name.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        config: EnvConfig | dict | None = None,
        retriever: RetrieverLike | None = None,
        examples: list[QAExample] | None = None,
        retriever_config: RetrieverConfig | dict | None = None,
        render_mode: str | None = None,
    ):
        self.config = from_dict(EnvConfig, config) if isinstance(config, dict) else (config or EnvConfig())
        ZipRLConfig(env=self.config).validate()
        if retriever is not None and hasattr(retriever, "__len__"):
            check_top_k(self.config, len(retriever))
        if isinstance(retriever_config, dict):
            retriever_config = from_dict(RetrieverConfig, retriever_config)
        self._retriever = retriever
        self._retriever_config = retriever_config or RetrieverConfig()
        self._examples = examples
        self.render_mode = render_mode
        self.observation_space = UnicodeText()
        self.action_space = UnicodeText()
        self.strategy: Strategy = STRATEGIES[self.config.strategy](self.config)
        self.tools: dict[str, Tool] = {name: TOOLS[name]() for name in TOOLS}
        self.system = self.strategy.system_prompt()
        self.example: QAExample | None = None
        self.context: ContextState | None = None
        self.turn = 0
        self._done = True
        self._last_obs = ""
        self.noise = None  # the episode's noise stream (env.retrieval_noise), spawned at reset

    @property
    def retriever(self) -> RetrieverLike:
        if self._retriever is None:
            from ziprl.retrieval.retriever import Retriever

            self._retriever = Retriever.from_config(self._retriever_config)
        return self._retriever

    @property
    def examples(self) -> list[QAExample]:
        if self._examples is None:
            from ziprl.retrieval.datasets import load_dataset

            self._examples = load_dataset("sample")
        return self._examples

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.noise = noise_rng(self.np_random.bit_generator.seed_seq)
        if self.config.retrieval_noise > 0:
            check_noise_retriever(self.retriever)
        options = options or {}
        if "example" in options:
            self.example = _as_example(options["example"])
        elif "index" in options:
            self.example = self.examples[int(options["index"])]
        else:
            self.example = self.examples[int(self.np_random.integers(len(self.examples)))]
        self.context = self.strategy.new_context(self.example.question)
        self.turn, self._done = 0, False
        messages = self.messages()
        self._last_obs = render_messages(messages)
        return self._last_obs, {"turn": 0, "question_id": self.example.id, "messages": messages,
                                "context_chars": len(self._last_obs)}

    @property
    def done(self) -> bool:
        """True once the episode has terminated or been truncated (or before the first reset)."""
        return self._done

    def messages(self) -> list[dict[str, str]]:
        """Chat messages for the next turn."""
        return self.context.messages(self.system, self.turn + 1, self.config.max_turns)

    def _score(self, parsed: ParsedTurn, level: int | None) -> CompressionScore | None:
        """Q_com of this turn's compression at ``level`` against the pending raw observation (None if nothing
        was pending)."""
        c, pending = self.config, self.context.pending
        if pending is None or not self.strategy.compresses and parsed.compression is None:
            return None
        if parsed.compression is None or level is None:
            return _ZERO  # owed a compression, gave no valid one
        return compression_quality(self.example.question, pending.text, unescape(parsed.compression), level,
                                   level_scale=c.scoring.level_scale, weights=c.scoring)

    def _act(self, parsed: ParsedTurn) -> ToolResult:
        """Run the turn's tool; a ValueError it raises becomes a tool error for the agent."""
        try:
            result = self.tools[parsed.action].run(self, unescape(parsed.argument), parsed.argument)
        except ValueError as exc:
            return ToolResult(error=f"the {parsed.action} tool rejected the request: {exc}")
        if result.observation is None:
            return result
        return dataclasses.replace(result, observation=dataclasses.replace(result.observation, tool=parsed.action))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("the episode is over (or never started): call reset() before step()")
        c, ctx = self.config, self.context
        self.turn += 1
        action = scrub(action) if isinstance(action, str) else action  # lone surrogates never reach a tokenizer
        parsed = parse_turn(action, c.max_response_chars, tuple(self.tools))
        if parsed.error is None and self.strategy.compresses and parsed.compression is None:
            parsed = dataclasses.replace(parsed, error='missing the <compress level="N">…</compress> block')
        level = self.strategy.level(parsed.level)
        score = self._score(parsed, level)
        observation_chars = len(ctx.pending.text) if ctx.pending else 0
        result, terminated = ToolResult(), False
        if parsed.error is not None:
            ctx.reject(action if isinstance(action, str) else "", parsed.error)
        else:
            result = self._act(parsed)
            note = unescape(parsed.compression) if parsed.compression else None
            ctx.commit(self.turn, action, note, level, result.observation)
            if result.error:
                ctx.notice = result.error
            terminated = self.tools[parsed.action].terminal
        truncated = not terminated and self.turn >= c.max_turns
        self._done = terminated or truncated
        messages = self.messages()
        self._last_obs = render_messages(messages)
        info: dict[str, Any] = {
            "turn": self.turn,
            "action": parsed.action if parsed.error is None else "invalid",
            "argument": parsed.argument,
            "level": level if parsed.error is None else parsed.level,
            "q_com": score.total if score else None,
            "q_ratio": score.ratio if score else None,
            "q_level": score.level if score else None,
            "q_info": score.info if score else None,
            "q_sem": score.sem if score else None,
            "format_error": parsed.error,
            "tool_error": result.error,
            "observation_chars": observation_chars,
            "context_chars": len(self._last_obs),
            "retrieved": result.retrieved,
            "noisy_hits": len(result.noise_doc_ids),
            "noise_doc_ids": result.noise_doc_ids,
            "messages": messages,
            **result.metrics,
        }
        return self._last_obs, float(result.reward), terminated, truncated, info

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None
