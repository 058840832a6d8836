"""VLLMEngine without CUDA: interface conformance, the install error, and weight-name validation."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

from ziprl.config import ModelConfig
from ziprl.policy import GenerationEngine, VLLMEngine, make_engine, resolve_model_path
from ziprl.policy.engines.vllm.engine import check_named_shapes, checkpoint_shapes

NO_VLLM = importlib.util.find_spec("vllm") is None


def test_implements_the_whole_interface():
    assert issubclass(VLLMEngine, GenerationEngine)
    assert not VLLMEngine.__abstractmethods__
    for name in ("generate", "load_weights"):
        assert inspect.signature(getattr(VLLMEngine, name)) == inspect.signature(getattr(GenerationEngine, name))


@pytest.mark.skipif(not NO_VLLM, reason="vllm is installed here")
def test_without_vllm_the_error_says_what_to_install(tmp_path):
    with pytest.raises(ImportError, match=r"pip install 'ziprl\[gpu\]'.*CUDA|CUDA.*pip install 'ziprl\[gpu\]'"):
        VLLMEngine(tmp_path)
    with pytest.raises(ImportError, match="model.engine=hf"):
        make_engine(ModelConfig(engine="vllm"), path=tmp_path)


def test_weight_names_are_checked_against_the_checkpoint():
    shapes, tied = checkpoint_shapes(resolve_model_path(ModelConfig()))
    embed = "model.embed_tokens.weight"
    assert shapes["lm_head.weight"] == shapes[embed] == (49152, 576)
    assert tied["lm_head.weight"] == embed
    full = dict(shapes)
    check_named_shapes(full, shapes, tied)  # a learner's state dict: both tied names
    check_named_shapes({k: v for k, v in full.items() if k != "lm_head.weight"}, shapes, tied)
    check_named_shapes({k: v for k, v in full.items() if k != embed}, shapes, tied)
    with pytest.raises(KeyError, match="unknown"):
        check_named_shapes({**full, "model.extra.weight": (1,)}, shapes, tied)
    with pytest.raises(ValueError, match="shape"):
        check_named_shapes({**full, "model.norm.weight": (3,)}, shapes, tied)
    with pytest.raises(KeyError, match="no new value"):
        check_named_shapes({k: v for k, v in full.items() if k != "model.norm.weight"}, shapes, tied)
    with pytest.raises(KeyError, match="no new value"):
        check_named_shapes({k: v for k, v in full.items() if k not in ("lm_head.weight", embed)}, shapes, tied)
