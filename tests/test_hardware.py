"""The learner's hardware facts: native bf16 detection, the GEMM peak, and MFU's formula."""

from __future__ import annotations

import time

import pytest
import torch

from ziprl.learner.hardware import (
    GemmPeak,
    cpu_has_bf16,
    device_clock,
    gemm_peak_flops,
    model_flop_utilisation,
)


def test_mfu_is_six_n_d_over_time_and_peak():
    # 6 * 1e8 params * 1e4 tokens = 6e12 FLOP in 10 s against a 1 TFLOP/s peak
    assert model_flop_utilisation(100_000_000, 10_000, 10.0, 1e12) == pytest.approx(0.6)
    assert model_flop_utilisation(1, 1, 0.0, 1e12) == 0.0 and model_flop_utilisation(1, 1, 1.0, 0.0) == 0.0


def test_cpu_bf16_flags_are_read_from_cpuinfo():
    assert cpu_has_bf16("flags\t\t: fpu sse avx512f avx512_bf16\n")
    assert cpu_has_bf16("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not cpu_has_bf16("flags\t\t: fpu sse avx512f\n") and not cpu_has_bf16("")


def test_gemm_peak_is_measured_each_call(monkeypatch):
    """Measured anew each call (no cache): the learner's ``GemmPeak`` decides how often (below)."""
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(1) or real_mm(a, b))
    first = gemm_peak_flops(torch.float32, "cpu", n=64, reps=2)
    second = gemm_peak_flops(torch.float32, "cpu", n=64, reps=2)
    assert first > 0 and second > 0 and len(calls) == 2 * 3  # reps + 1 warm-up product, twice


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
    """CUDA runs kernels asynchronously: the clock synchronises the learner's device before it reads the time (on
    an H100 the unsynchronised split billed Qwen3-0.6B's forward to its backward: 0.86 s vs 3.57 s)."""
    assert device_clock(torch.device("cpu")) is time.perf_counter
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    clock, gpu = device_clock(torch.device("cuda", 1)), torch.device("cuda", 1)
    before = time.perf_counter()
    assert before <= clock() <= time.perf_counter() and waited == [gpu]


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
