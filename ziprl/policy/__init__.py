"""Policy: model loading, generation engines (HF transformers, vLLM) and the rollout loop."""

from __future__ import annotations

from pathlib import Path

from ziprl.config import ModelConfig
from ziprl.policy.engine import Generation, GenerationEngine
from ziprl.policy.hf_engine import HFEngine
from ziprl.policy.models import (
    ModelPathError,
    convert_default_model,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from ziprl.policy.vllm_engine import VLLMEngine

__all__ = [
    "Generation",
    "GenerationEngine",
    "HFEngine",
    "ModelPathError",
    "VLLMEngine",
    "convert_default_model",
    "load_model",
    "load_tokenizer",
    "make_engine",
    "resolve_model_path",
]


def make_engine(model_cfg: ModelConfig, path: str | Path | None = None) -> GenerationEngine:
    """The engine ``model_cfg.engine`` names, over ``path`` (e.g. a learner checkpoint) or ``model_cfg``'s model."""
    if model_cfg.num_threads:
        import torch

        torch.set_num_threads(model_cfg.num_threads)
    model_path = Path(path) if path is not None else resolve_model_path(model_cfg)
    if model_cfg.engine == "vllm":
        return VLLMEngine(model_path, dtype=model_cfg.dtype, gpu_memory_utilization=model_cfg.gpu_memory_utilization,
                          trust_remote_code=model_cfg.trust_remote_code)
    if model_cfg.engine == "hf":
        return HFEngine(model_path, dtype=model_cfg.dtype, device=model_cfg.device,
                        trust_remote_code=model_cfg.trust_remote_code)
    raise ValueError(f"model.engine must be 'hf' or 'vllm', got {model_cfg.engine!r}")
