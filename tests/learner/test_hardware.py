"""The learner's hardware facts: native bf16 detection, the GEMM peak, MFU's formula, and the learner settings
chosen from them."""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import pytest
import torch

from ziprl.config import LearnerConfig
from ziprl.learner.hardware import (
    GemmPeak,
    Hardware,
    ModelSize,
    choose_learner,
    cpu_has_bf16,
    device_clock,
    gemm_peak_flops,
    hardware,
    model_flop_utilisation,
)


def test_mfu_is_six_n_d_over_time_and_peak():
    # 6 * 1e8 params * 1e4 tokens = 6e12 FLOP in 10 s against a 1 TFLOP/s peak
    assert model_flop_utilisation(100_000_000, 10_000, 10.0, 1e12) == pytest.approx(0.6)
    assert model_flop_utilisation(1, 1, 0.0, 1e12) == 0.0
    assert model_flop_utilisation(1, 1, 1.0, 0.0) == 0.0


def test_cpu_bf16_flags_are_read_from_cpuinfo():
    assert cpu_has_bf16("flags\t\t: fpu sse avx512f avx512_bf16\n")
    assert cpu_has_bf16("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not cpu_has_bf16("flags\t\t: fpu sse avx512f\n")
    assert not cpu_has_bf16("")


def test_gemm_peak_is_measured_each_call(monkeypatch):
    """Measured anew each call (no cache): the learner's ``GemmPeak`` decides how often (below)."""
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(1) or real_mm(a, b))
    first = gemm_peak_flops(torch.float32, "cpu", n=64, reps=2)
    second = gemm_peak_flops(torch.float32, "cpu", n=64, reps=2)
    assert first > 0
    assert second > 0
    assert len(calls) == 2 * 3  # reps + 1 warm-up product, twice


@pytest.mark.parametrize(("device", "n"), [("cpu", 2048), ("cuda", 8192), ("cuda:1", 8192)])
def test_the_gemm_peak_is_measured_at_a_size_that_fills_the_device(monkeypatch, device, n):
    """A GPU reaches its peak only on large products (an H100: 2048² bf16 at 254-418 TFLOP/s, 8192² ~800)."""
    class Sized(Exception):
        """Raised once the size is known: no product runs (this machine has no GPU)."""

    sizes = []

    def randn(*shape, device):
        sizes.append((shape, device))
        raise Sized

    monkeypatch.setattr(torch, "randn", randn)
    with pytest.raises(Sized):
        gemm_peak_flops(torch.bfloat16, device)
    assert sizes == [((n, n), device)]


def test_the_learners_gemm_peak_is_measured_every_tenth_step(monkeypatch):
    """A step's MFU uses a peak measured at most ``every`` steps before (re-measuring each step cost 8% of it)."""
    from ziprl.learner import hardware

    measured = iter(range(1, 100))
    monkeypatch.setattr(hardware, "gemm_peak_flops", lambda dtype, device: float(next(measured)))
    peak = GemmPeak(torch.float32, "cpu", every=10)
    assert [peak() for _ in range(25)] == [1.0] * 10 + [2.0] * 10 + [3.0] * 5


def test_the_learners_gemm_peak_follows_the_cpu_thread_count(monkeypatch):
    """A learner given the idle rollout cores for a step runs it on more threads: its MFU compares with the peak
    of that many threads, kept apart from the other count's."""
    from ziprl.learner import hardware

    monkeypatch.setattr(hardware, "gemm_peak_flops", lambda dtype, device: float(torch.get_num_threads()))
    peak, before = GemmPeak(torch.float32, "cpu", every=10), torch.get_num_threads()
    try:
        seen = []
        for threads in (1, 2, 1, 2):
            torch.set_num_threads(threads)
            seen.append(peak())
    finally:
        torch.set_num_threads(before)
    assert seen == [1.0, 2.0, 1.0, 2.0]


def test_the_device_clock_waits_for_queued_cuda_work(monkeypatch):
    """CUDA runs kernels asynchronously: the clock waits for the learner's stream before it reads the time (on an
    H100 the unsynchronised split billed Qwen3-0.6B's forward to its backward: 0.86 s vs 3.57 s), and for that
    stream only: a device-wide synchronize would bill the step for a rollout's kernels beside it and fails a CUDA
    graph capture in flight on the rollout's thread (rollout.overlap=thread; seen on an H200)."""
    assert device_clock(torch.device("cpu")) is time.perf_counter
    waited = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            waited.append(self.device)

    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waited.append("the whole device"))
    clock, gpu = device_clock(torch.device("cuda", 1)), torch.device("cuda", 1)
    before = time.perf_counter()
    assert before <= clock() <= time.perf_counter()
    assert waited == [gpu]


@pytest.mark.parametrize(("bf16_rate", "f32_rate", "expected"), [(900e9, 220e9, True), (190e9, 300e9, False),
                                                                (320e9, 300e9, False)])
def test_bf16_is_chosen_on_a_cpu_only_where_it_is_measured_faster(monkeypatch, bf16_rate, f32_rate, expected):
    """AMD's AVX-512 BF16 measured ~4x float32 here, an Intel CPU with AVX-512 BF16 but no AMX 0.6x: the flag alone
    would slow the learner down, so the measured rates decide."""
    from ziprl.learner import hardware

    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda cpuinfo=None: True)
    rates = {torch.bfloat16: bf16_rate, torch.float32: f32_rate}
    monkeypatch.setattr(hardware, "gemm_rates", lambda dtypes, device, **kw: {d: rates[d] for d in dtypes})
    assert hardware.bf16_pays("cpu") is expected
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda cpuinfo=None: False)
    assert hardware.bf16_pays("cpu") is False  # no bf16 instructions: never measured, never chosen


def test_a_burst_of_load_during_the_measurement_does_not_decide_the_dtype(monkeypatch):
    """Another process busy for part of the measurement (a launch overlapping the learner's start with other work) made
    the bf16 products look slow and the learner chose float32 on a CPU where bf16 runs 4x faster. The two dtypes'
    products now alternate and each keeps its best: a burst slows both alike and the best unloaded ones decide."""
    from ziprl.learner import hardware

    clock, products = [0.0], []

    def mm(a, b):  # bf16 4x faster; the first 4 products run 10x slower (the burst)
        products.append(a.dtype)
        clock[0] += (1.0 if a.dtype == torch.bfloat16 else 4.0) * (10.0 if len(products) <= 4 else 1.0)

    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda cpuinfo=None: True)
    monkeypatch.setattr(hardware, "device_clock", lambda device: lambda: clock[0])
    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(torch, "randn", lambda *shape, device: torch.zeros(2, 2))
    assert hardware.bf16_pays("cpu") is True
    assert products[:4] == [torch.bfloat16, torch.float32] * 2  # alternating from the first (warm-up) product


# The learner's settings chosen from fake hardware facts (total_memory as torch reports these cards) and the
# published models' sizes.
H100 = Hardware("cuda", 85_520_809_984, True)
H200 = Hardware("cuda", 150_754_820_096, True)
RTX_24GB = Hardware("cuda", 25_393_692_672, True)
SMOLLM2_135M = ModelSize(134_515_008, 30, 576, 49152)
QWEN3_1P7B = ModelSize(1_720_574_976, 28, 2048, 151936)
AUTO = ("bf16", "micro_batch_tokens", "share_prefix", "pack_rows", "zero_stage")


def settings(choice) -> tuple:
    lc = choice.learner
    return lc.bf16, lc.micro_batch_tokens, lc.share_prefix, lc.pack_rows, lc.zero_stage


@pytest.mark.parametrize("measured", [True, False])
def test_a_cpu_learner_keeps_the_cpu_choices(measured):
    """bf16 where measured faster, passes of micro_batch_turns turns, the shared prefix, packed rows, ZeRO 0: the CPU
    defaults."""
    choice = choose_learner(Hardware("cpu", 0, measured), SMOLLM2_135M, LearnerConfig())
    assert settings(choice) == (measured, 0, True, True, 0)
    assert choice.chosen == AUTO
    assert choice.warning == ""


@pytest.mark.parametrize(("hw", "size", "beta", "want"), [
    (H100, SMOLLM2_135M, 0.001, 16384),  # memory for far more: the budget's cap
    (H200, SMOLLM2_135M, 0.001, 16384),
    (RTX_24GB, SMOLLM2_135M, 0.001, 15360),  # 19 GiB left, 1.03 MiB a token
    (H200, QWEN3_1P7B, 0.001, 16384),
    (H100, QWEN3_1P7B, 0.001, 9216),  # 0.8 x 79.6 GiB less 20 B a parameter, 3.3 MiB a token
    (H100, QWEN3_1P7B, 0.0, 10240),  # no reference model: 2 B a parameter more room
])
def test_a_gpu_learner_computes_in_bf16_unshared_at_zero_2_with_passes_of_what_memory_holds(hw, size, beta, want):
    choice = choose_learner(hw, size, LearnerConfig(beta=beta))
    assert settings(choice) == (True, want, False, False, 2)
    assert choice.chosen == AUTO
    assert choice.warning == ""


def test_a_model_too_large_for_the_gpu_gets_the_smallest_passes_and_a_warning():
    choice = choose_learner(RTX_24GB, QWEN3_1P7B, LearnerConfig())
    assert settings(choice) == (True, 1024, False, False, 2)  # one rank: ZeRO-3 would shard nothing
    assert "exceeds 80% of this GPU's 24 GiB: expect out-of-memory" in choice.warning
    assert "warning: ~" in choice.summary()


def test_several_ranks_shard_the_weights_where_zero_2_leaves_too_little_room():
    """Eight 24 GB ranks: ZeRO-2 keeps 2 + 14/8 B a parameter on each (and 4 B of the engine's and reference's
    weights), room for ~2.0k tokens a pass; ZeRO-3 16/8 B, room for ~2.9k."""
    eight = choose_learner(dataclasses.replace(RTX_24GB, ranks=8), QWEN3_1P7B, LearnerConfig())
    assert settings(eight) == (True, 2048, False, False, 3)
    assert eight.warning == ""
    assert choose_learner(dataclasses.replace(H100, ranks=4), QWEN3_1P7B, LearnerConfig()).learner.zero_stage == 2


def test_what_the_user_set_wins_and_the_config_given_is_left_as_it_was():
    lc = LearnerConfig(bf16=False, micro_batch_tokens=4096, share_prefix=True, pack_rows=True, zero_stage=0)
    for hw in (H100, Hardware("cpu", 0, True)):
        choice = choose_learner(hw, QWEN3_1P7B, lc)
        assert settings(choice) == (False, 4096, True, True, 0)
        assert choice.chosen == ()
    partly = LearnerConfig(micro_batch_tokens=0)
    choice = choose_learner(H200, SMOLLM2_135M, partly)
    assert settings(choice) == (True, 0, False, False, 2)
    assert choice.chosen == ("bf16", "share_prefix", "pack_rows", "zero_stage")
    assert partly.micro_batch_tokens == 0
    assert partly.zero_stage is None  # not modified
    assert choose_learner(H200, SMOLLM2_135M, partly) == choice  # a pure function of its inputs


def test_the_summary_names_each_setting_and_whether_it_was_chosen():
    choice = choose_learner(H100, QWEN3_1P7B, LearnerConfig(zero_stage=3))
    assert choice.summary() == ("[learner] cuda (1 rank, 79.6 GiB a GPU), 1,721M parameters: bf16 on (chosen), "
                                "micro_batch_tokens 9216 (chosen), share_prefix off (chosen), pack_rows off (chosen), "
                                "zero_stage 3 (set)")
    cpu = choose_learner(Hardware("cpu", 0, False), SMOLLM2_135M, LearnerConfig())
    assert cpu.summary().startswith("[learner] cpu (1 rank), 135M parameters: bf16 off (chosen)")


def test_the_hardware_facts_of_a_cpu(monkeypatch):
    from ziprl.learner import hardware as hw

    monkeypatch.setattr(hw, "bf16_pays", lambda device: True)
    assert hardware("cpu", 2, measure_bf16=True) == Hardware("cpu", 0, True, 2)
    assert hardware("cpu", 1, measure_bf16=False) == Hardware("cpu", 0, None, 1)  # the user chose: not measured


def test_the_size_of_a_model_and_what_a_pass_keeps_per_token():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    size = ModelSize.of(model)
    assert size == ModelSize(sum(p.numel() for p in model.parameters()), 2, 16, 100)
    assert size.activation_bytes() == 34 * 2 * 16 + 10 * 100
    assert QWEN3_1P7B.activation_bytes() / 2**20 == pytest.approx(3.31, abs=0.01)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="the trainer needs DeepSpeed")
def test_the_trainer_runs_on_what_it_chose_and_says_so_once(tiny_model_dir, capsys):
    from ziprl.config import ZipRLConfig
    from ziprl.learner.trainer import Trainer

    cfg = ZipRLConfig()
    cfg.model.device, cfg.learner.bf16 = "cpu", False
    trainer = Trainer(cfg, tiny_model_dir)
    lc = trainer.cfg.learner
    assert (lc.bf16, lc.micro_batch_tokens, lc.share_prefix, lc.pack_rows, lc.zero_stage) == (False, 0, True, True, 0)
    assert trainer.zero_stage == 0
    assert trainer.share_prefix
    assert not trainer.bf16
    assert cfg.learner.zero_stage is None  # the caller's config is left as it was
    out = capsys.readouterr().out
    assert out.count("[learner] cpu (1 rank)") == 1
    assert ("bf16 off (set), micro_batch_tokens 0 (chosen), share_prefix on (chosen), pack_rows on (chosen), "
            "zero_stage 0 (chosen)") in out
