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
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(gpu_step.arch_config(arch))
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, abs=0.1)


def test_an_unknown_architecture_exits_2_naming_the_choices(capsys):
    assert gpu_step.main(["--archs", "smollm2-135m,llama-70b"]) == 2
    err = capsys.readouterr().err
    assert "llama-70b" in err
    assert "qwen3-1.7b" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_without_cuda_there_is_nothing_to_measure(capsys):
    assert gpu_step.main(["--archs", "smollm2-135m"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_the_kernel_split_sorts_kernels_by_name_and_counts_only_device_time():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def ev(name, us, device=DeviceType.CUDA):
        return SimpleNamespace(key=name, self_device_time_total=us, device_type=device)

    events = [ev("sm90_xmma_gemm_bf16bf16_bf16f32", 4e6), ev("nvjet_tst_128x256", 1e6),
              ev("pytorch_flash::flash_fwd_kernel", 1e6), ev("fmha_cutlassB_bf16_aligned", 0.5e6),
              ev("ncclDevKernel_AllReduce_Sum_bf16", 0.25e6), ev("Memcpy DtoD (Device -> Device)", 0.25e6),
              ev("void at::native::vectorized_elementwise_kernel<4>", 1e6), ev("triton_red_fused_rms", 0.5e6),
              ev("aten::mm", 9e6, DeviceType.CPU)]  # a host op: its kernels are counted once, as kernels
    split = gpu_step.kernel_split(events, seconds=10.0)
    assert split == {"gpu_gemm_s": 5.0, "gpu_attention_s": 1.5, "gpu_collective_s": 0.25, "gpu_copy_s": 0.25,
                     "gpu_elementwise_s": 1.0, "gpu_other_s": 0.5, "gpu_busy_frac": 0.85}


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "0", "--questions", "0"], "argument --steps: '0': must be at least 1"),
    (["--questions", "0"], "argument --questions: '0': must be at least 1"),
    (["--group", "0"], "argument --group: '0': must be at least 1"),
    (["--turns", "-1"], "argument --turns: '-1': must be at least 1"),
    (["--new-tokens", "x"], "argument --new-tokens: 'x' is not an integer"),
    (["--micro-batch", "0"], "argument --micro-batch: '0': must be at least 1"),
    (["--zero-stage", "0"], "argument --zero-stage: invalid choice: 0"),
    (["--prompt-spread", "nan"], "argument --prompt-spread: 'nan': must be at least 0.0"),
    (["--archs", "tiny", "--prompt-tokens", "8000", "--new-tokens", "256"], "longer than the 8192 positions"),
])
def test_bad_counts_and_sizes_exit_2_when_the_arguments_are_parsed_even_without_a_gpu(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_step.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert message in err
    assert "no CUDA GPU" not in out


def test_bad_overrides_exit_2_before_any_work(capsys):
    assert gpu_step.main(["--set", "learner.share_prefixx=false"]) == 2
    assert "share_prefixx" in capsys.readouterr().err


def test_a_timed_checkpoint_is_a_whole_checkpoint_with_its_seconds_and_size(tiny_model_dir, tmp_path):
    """``--checkpoint``'s row: the snapshot's and the write's seconds, and the size of a checkpoint that loads."""
    from ziprl.learner.checkpoint import latest_checkpoint, load_checkpoint
    from ziprl.learner.trainer import Trainer
    from ziprl.testing.learner import make_cfg

    trainer = Trainer(make_cfg(), tiny_model_dir)
    row = gpu_step.timed_checkpoint(trainer, tmp_path)
    assert set(row) == {"snapshot_s", "write_s", "checkpoint_gb"}
    assert row["snapshot_s"] > 0
    assert row["write_s"] > 0
    params = sum(p.numel() for p in trainer.engine.module.parameters())
    assert row["checkpoint_gb"] == pytest.approx(params * 4 / 1e9, rel=0.2)  # float32 weights (no moments yet)
    assert load_checkpoint(trainer, latest_checkpoint(tmp_path)) == {}


def test_the_checkpoint_benchmark_checks_its_architectures_then_needs_a_gpu(capsys):
    """benchmarks/gpu_checkpoint.py: an unknown architecture exits 2 naming the choices; without CUDA, nothing to do."""
    import gpu_checkpoint

    assert gpu_checkpoint.main(["--archs", "qwen3-0.6b,llama-70b"]) == 2
    assert "llama-70b" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert gpu_checkpoint.main([]) == 0
        assert "no CUDA GPU" in capsys.readouterr().out
