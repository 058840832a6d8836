"""Policy: model loading, generation engines (registered in :data:`ziprl.registry.ENGINES`) and the rollout loop.

Importing it stays cheap (the config looks engine names up through ``ziprl.policy.engines``): ``HFEngine``
(torch) and ``VLLMEngine`` are imported on first access.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ziprl.config import ModelConfig, resolve_engine_dtype
from ziprl.policy.engine import EngineSpec, Generation, GenerationEngine
from ziprl.policy.models import (
    ModelPathError,
    convert_default_model,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from ziprl.registry import ENGINES

__all__ = [
    "EngineSpec",
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

_LAZY = {"HFEngine": "ziprl.policy.engines.hf.engine", "VLLMEngine": "ziprl.policy.engines.vllm.engine"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_engine(model_cfg: ModelConfig, path: str | Path | None = None) -> GenerationEngine:
    """The engine ``model_cfg.engine`` names, over ``path`` (e.g. a learner checkpoint) or ``model_cfg``'s model.

    An unregistered name raises the registry's KeyError, which lists the registered engines.
    """
    model_cfg = resolve_engine_dtype(model_cfg, None)  # engines generating for a learner come resolved
    spec: EngineSpec = ENGINES[model_cfg.engine]
    if model_cfg.num_threads:
        import torch

        torch.set_num_threads(model_cfg.num_threads)
    model_path = Path(path) if path is not None else resolve_model_path(model_cfg)
    return spec.make(model_cfg, model_path)
