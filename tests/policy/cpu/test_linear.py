"""Packed oneDNN linears of a bfloat16 HFEngine on CPU: the same logits as torch's linear, new weights repacked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ziprl.config import SamplingConfig
from ziprl.policy import HFEngine
from ziprl.policy.cpu.linear import PackedForward, can_pack, pack_linears
from ziprl.policy.models import load_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(not (torch.backends.mkldnn.is_available()
                                      and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                                 reason="this CPU has no oneDNN bfloat16 kernels")]


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def test_a_bf16_engine_computes_with_packed_weights_and_the_same_logits(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, dtype="bfloat16", device="cpu")
    linears = [m for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
    assert engine.packed_linears
    assert linears
    assert all(isinstance(m.forward, PackedForward) for m in linears)
    plain = load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    ids = [(7 * i) % 5000 + 1 for i in range(300)]
    assert torch.equal(logits(engine.model, ids), logits(plain, ids))


def test_models_that_cannot_pack_are_left_as_they_are(tiny_model_dir):
    full = load_model(tiny_model_dir, dtype="float32", device="cpu")
    assert not can_pack(full)
    assert not pack_linears(full)
    assert not any("forward" in m.__dict__ for m in full.modules())
    assert not HFEngine(tiny_model_dir, dtype="float32", device="cpu").packed_linears
    given = load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    assert not HFEngine(model=given, tokenizer=HFEngine(tiny_model_dir, device="cpu").tokenizer).packed_linears


def test_new_weights_are_repacked(tiny_model_dir):
    """After load_weights the packed layers compute with the new weights (shared arrays, then another dtype)."""
    engine = HFEngine(tiny_model_dir, dtype="bfloat16", device="cpu")
    ids = [(11 * i) % 5000 + 1 for i in range(200)]
    rng = np.random.default_rng(0)
    new = {k: (v.detach().float().numpy() + rng.normal(0, 0.05, v.shape)).astype(np.float32)
           for k, v in engine.model.named_parameters()}
    engine.load_weights(new, version=1)
    moved = load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    moved.load_state_dict({k: torch.from_numpy(v) for k, v in new.items()}, strict=False)
    assert torch.equal(logits(engine.model, ids), logits(moved, ids))
    sampling = SamplingConfig(greedy=True, max_new_tokens=6, stop=[])
    assert engine.generate([ids], sampling)[0].token_ids == HFEngine(
        model=moved, tokenizer=engine.tokenizer).generate([ids], sampling)[0].token_ids
