"""The rollout job's own CUDA stream (``rollout.overlap=thread``): off CUDA a no-op, so the CPU runs the same code;
on CUDA, tests/test_gpu.py."""

from __future__ import annotations

import torch

from ziprl.policy.side_stream import side_stream


def test_off_cuda_the_context_is_a_no_op_at_every_entry():
    stream = side_stream("cpu")
    for _ in range(2):
        with stream():
            x = torch.ones(2) + 1
        assert x.tolist() == [2.0, 2.0]
    assert not torch.cuda.is_initialized()
