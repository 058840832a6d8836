"""benchmarks/gpu_step.py without a GPU: its architectures have the published models' sizes, bad input exits 2
before any work, and a machine without CUDA is told there is nothing to measure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_step  # noqa: E402


@pytest.mark.parametrize(("arch", "millions"), [("smollm2-135m", 134.5), ("qwen3-0.6b", 596.0),
                                                ("qwen3-1.7b", 1720.6)])
def test_each_architecture_has_its_published_size(arch, millions):
    cls_name, shape = gpu_step.ARCHS[arch]
    config = getattr(transformers, cls_name)(**shape, tie_word_embeddings=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, abs=0.1)


def test_an_unknown_architecture_exits_2_naming_the_choices(capsys):
    assert gpu_step.main(["--archs", "smollm2-135m,llama-70b"]) == 2
    err = capsys.readouterr().err
    assert "llama-70b" in err and "qwen3-1.7b" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_without_cuda_there_is_nothing_to_measure(capsys):
    assert gpu_step.main(["--archs", "smollm2-135m"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
