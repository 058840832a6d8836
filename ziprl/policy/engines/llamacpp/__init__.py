"""``llamacpp``: llama.cpp on CPU (:class:`ziprl.policy.engines.llamacpp.engine.LlamaCppEngine`; needs
llama-cpp-python)."""

from __future__ import annotations

from pathlib import Path

from ziprl.config import ModelConfig
from ziprl.policy.engine import EngineSpec, GenerationEngine
from ziprl.registry import ENGINES


def engine_class() -> type[GenerationEngine]:
    from ziprl.policy.engines.llamacpp.engine import LlamaCppEngine

    return LlamaCppEngine


def build(cls: type[GenerationEngine], m: ModelConfig, path: Path) -> GenerationEngine:
    return cls(path, dtype=m.dtype, threads=m.num_threads)


# its own kernels: log-probs differ from the learner's in the last bits, whatever the dtype
SPEC = ENGINES.register("llamacpp", order=2)(EngineSpec(
    engine_class, build, cpu=True, exact_logprobs=lambda m: False, requires="llama_cpp",
    install="pip install 'ziprl[llamacpp]' (builds llama.cpp: a C++ compiler and cmake, ~5 minutes)"))
