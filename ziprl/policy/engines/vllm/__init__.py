"""``vllm``: vLLM on a CUDA GPU (:class:`ziprl.policy.engines.vllm.engine.VLLMEngine`; the optional ``gpu`` extra)."""

from __future__ import annotations

from pathlib import Path

from ziprl.config import ModelConfig
from ziprl.policy.engine import EngineSpec, GenerationEngine
from ziprl.registry import ENGINES


def engine_class() -> type[GenerationEngine]:
    from ziprl.policy.engines.vllm.engine import VLLMEngine

    return VLLMEngine


def build(cls: type[GenerationEngine], m: ModelConfig, path: Path) -> GenerationEngine:
    return cls(path, dtype=m.dtype, gpu_memory_utilization=m.gpu_memory_utilization,
               trust_remote_code=m.trust_remote_code)


# its own kernels: log-probs differ from the learner's in the last bits, whatever the dtype
SPEC = ENGINES.register("vllm", order=1)(EngineSpec(engine_class, build, cpu=False, exact_logprobs=lambda m: False,
                                                    claims_gpu_memory=True))
