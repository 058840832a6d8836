"""The in-process weight push: the learner's weights, copied once in the engine's dtype, loaded into the
engine."""

from __future__ import annotations

import numpy as np
import pytest

from ziprl.weights.in_process import InProcess


def test_in_process_push_loads_the_learner_weights_into_the_engine():
    class Engine:
        weights_device, weights_dtype = "cpu", "bfloat16"

        def load_weights(self, named, version):
            self.named, self.version = named, version

    engine, weights, asked = Engine(), {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}, []
    stats = InProcess(lambda device, dtype: asked.append((device, dtype)) or weights, engine).push(4)
    assert engine.version == 4
    assert engine.named is weights
    assert asked == [("cpu", "bfloat16")]
    assert stats["bytes"] == 36.0
    assert stats["seconds"] >= 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_in_process_push_hands_the_engine_its_own_copy_in_its_dtype(tiny_model_dir, dtype):
    """The learner copies its weights once, in the engine's dtype on the engine's device (on a GPU no host round
    trip: benchmarks/gpu_step.py), and the engine keeps that copy: a later step of the learner does not reach it
    (a float32 engine takes the tensor as it is, so the copy is what keeps them apart)."""
    import torch

    from ziprl.learner.trainer import Trainer
    from ziprl.policy import HFEngine
    from ziprl.testing.learner import make_cfg, make_groups

    trainer = Trainer(make_cfg(lr=1e-2, beta=0.0), tiny_model_dir)
    engine = HFEngine(tiny_model_dir, dtype=dtype, device="cpu")
    assert (engine.weights_device, engine.weights_dtype) == ("cpu", dtype)
    trainer.train_step(make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=1))
    stats = InProcess(trainer.named_weights, engine).push(1)
    pushed = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    learner = trainer.named_weights()
    assert pushed.keys() == learner.keys()
    assert engine.version == 1
    assert all(torch.equal(pushed[n], learner[n].to(getattr(torch, dtype))) for n in learner)
    assert stats["bytes"] == {"bfloat16": 2, "float32": 4}[dtype] * sum(t.numel() for t in learner.values())
    trainer.train_step(make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=1, seed=1))
    assert any(not torch.equal(trainer.named_weights()[n], learner[n]) for n in learner)  # the learner moved on
    assert all(torch.equal(p, pushed[n]) for n, p in engine.model.named_parameters())  # the engine did not
