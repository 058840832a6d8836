"""``hf``: HF transformers on CPU or GPU (:class:`ziprl.policy.engines.hf.engine.HFEngine`)."""

from __future__ import annotations

from pathlib import Path

from ziprl.config import ModelConfig
from ziprl.policy.engine import EngineSpec, GenerationEngine
from ziprl.registry import ENGINES


def engine_class() -> type[GenerationEngine]:
    from ziprl.policy.engines.hf.engine import HFEngine

    return HFEngine


def build(cls: type[GenerationEngine], m: ModelConfig, path: Path) -> GenerationEngine:
    return cls(path, dtype=m.dtype, device=m.device, trust_remote_code=m.trust_remote_code,
               fused_decode=m.fused_decode, static_decode=m.static_decode)


# float32 weights compute the learner's float32 log-probs exactly
SPEC = ENGINES.register("hf", order=0)(EngineSpec(engine_class, build, cpu=True,
                                                  exact_logprobs=lambda m: m.dtype == "float32"))
