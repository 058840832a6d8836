"""The one generation interface every engine (HF transformers, vLLM) implements, and the spec an engine registers
in :data:`ziprl.registry.ENGINES`."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ziprl.config import ModelConfig, SamplingConfig
from ziprl.env.chat import chat_ids
from ziprl.env.tools import closing_tags
from ziprl.weights import WeightReceiver


def stop_strings(sampling: SamplingConfig) -> list[str]:
    """The non-empty stop strings of ``sampling``; ``stop`` None means every registered tool's closing tag."""
    return [s for s in (closing_tags() if sampling.stop is None else sampling.stop) if s]


@dataclass
class Generation:
    """One sampled response: its tokens, the behaviour log-prob of each, and the decoded text."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length"


class GenerationEngine(WeightReceiver):
    """Batched generation with per-token behaviour log-probs and in-place weight updates.

    ``version`` is the policy version of the loaded weights (0 = initial); ``tokens_generated`` and
    ``generation_seconds`` accumulate for throughput reporting. New weights arrive through the
    :class:`~ziprl.weights.WeightReceiver` methods every engine has (``load_weights`` and the collective's).
    """

    tokens_generated: int = 0
    generation_seconds: float = 0.0
    max_context: int | None = None  # longest sequence (prompt + response) the model takes; None = unknown

    @property
    @abstractmethod
    def tokenizer(self) -> Any: ...

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat conversation rendered by the model's chat template, ready to generate.

        Special-token text inside a message stays plain text (see :func:`ziprl.env.chat.chat_ids`).
        """
        return chat_ids(self.tokenizer, messages)

    @abstractmethod
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int | None = None) -> list[Generation]:
        """Generate one response per prompt (token ids). Stops at EOS, a stop string, or max_new_tokens."""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.generation_seconds if self.generation_seconds else 0.0


@dataclass(frozen=True)
class EngineSpec:
    """A generation engine as registered in :data:`ziprl.registry.ENGINES`: how to build it and what it offers.

    The config looks names up, so a registration module stays cheap to import: ``engine_class`` and ``build``
    import the engine (torch, vLLM) only when called.
    """

    engine_class: Callable[[], type[GenerationEngine]]  # imports and returns the engine class
    build: Callable[[type[GenerationEngine], ModelConfig, Path], GenerationEngine]  # (class, model config, path)
    cpu: bool  # runs with model.device=cpu (else CUDA only)
    exact_logprobs: Callable[[ModelConfig], bool]  # behaviour log-probs are exactly the float32 learner's
    claims_gpu_memory: bool = False  # takes model.gpu_memory_utilization of its GPU up front
    requires: str | None = None  # a module the engine imports, checked when the config is (None: checked when built)
    install: str = ""  # how to install ``requires``

    def installed(self) -> bool:
        """Whether ``requires`` can be imported (found without importing it)."""
        import importlib.util

        return self.requires is None or importlib.util.find_spec(self.requires) is not None

    def make(self, model_cfg: ModelConfig, path: Path) -> GenerationEngine:
        return self.build(self.engine_class(), model_cfg, path)
