"""What the learner's hardware does: native bfloat16, the measured GEMM peak, and model-FLOP utilisation."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 matrix instructions


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); False where it cannot tell."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.is_file() else ""
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return any(f in flags for f in BF16_CPU_FLAGS)


BF16_MIN_SPEEDUP = 1.5  # a CPU learner computes in bf16 only when its bf16 products run this much faster


def native_bf16(device: str) -> bool:
    """True when ``device`` ("cpu" or "cuda") computes bfloat16 matrix products natively."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return cpu_has_bf16()


def bf16_pays(device: str) -> bool:
    """Whether bf16 compute is the faster choice on ``device``: CUDA with bf16; a CPU with bf16 instructions whose
    measured bf16 GEMM rate is >= ``BF16_MIN_SPEEDUP`` x its float32 rate (AMX or AMD's AVX-512 BF16 reach ~4x;
    an Intel CPU with AVX-512 BF16 but no AMX measured 0.6x: 190 vs 290-340 GFLOP/s on 2 threads)."""
    if not native_bf16(device):
        return False
    if device.startswith("cuda"):
        return True
    rates = gemm_rates((torch.bfloat16, torch.float32), device, reps=5)  # alternating: a burst of load hits both
    return rates[torch.bfloat16] >= BF16_MIN_SPEEDUP * rates[torch.float32]


def device_clock(device: torch.device) -> Callable[[], float]:
    """A clock for the work queued on ``device``: on CUDA it first waits for the queued kernels (they run
    asynchronously, so a plain clock bills a forward to whatever waits next: the loss's ``.item()``, the backward)."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


def gemm_peak_flops(dtype: torch.dtype, device: str, n: int | None = None, reps: int = 3) -> float:
    """FLOP/s of the best of ``reps`` n x n matrix products in ``dtype`` on ``device``, measured now (under whatever
    else the device is doing, like the step it is compared with). ``n`` None: 2048 on a CPU, 8192 on a GPU (an
    H100 ran 2048² bf16 products at 254-418 TFLOP/s, noisy and under half its ~800: MFU read 2-3x too high)."""
    return gemm_rates((dtype,), device, n, reps)[dtype]


def gemm_rates(dtypes: Sequence[torch.dtype], device: str, n: int | None = None, reps: int = 3
               ) -> dict[torch.dtype, float]:
    """:func:`gemm_peak_flops` of several dtypes, their products alternating (one of each per round), each dtype's
    best kept: load that comes and goes during the measurement slows them alike."""
    n = n or (8192 if device.startswith("cuda") else 2048)
    pairs = {d: (torch.randn(n, n, device=device).to(d), torch.randn(n, n, device=device).to(d)) for d in dtypes}
    clock, best = device_clock(torch.device(device)), dict.fromkeys(dtypes, float("inf"))
    for _ in range(reps + 1):  # the first round warms the kernels up
        for d, (a, b) in pairs.items():
            start = clock()
            torch.mm(a, b)
            best[d] = min(best[d], clock() - start)
    return {d: 2 * n**3 / t for d, t in best.items()}


class GemmPeak:
    """:func:`gemm_peak_flops` of one dtype on one device, measured on the first call and every ``every``-th after
    (a measurement took 0.37 s of a 4.8 s learner step: bf16, one CPU thread, benchmarks/vs_trl.py's step), per
    CPU thread count (a learner runs a step no rollout shares on more threads)."""

    def __init__(self, dtype: torch.dtype, device: str, every: int = 10) -> None:
        self.dtype, self.device, self.every = dtype, device, every
        self.calls: dict[int, int] = {}
        self.values: dict[int, float] = {}

    def __call__(self) -> float:
        key = torch.get_num_threads() if self.device == "cpu" else 0
        calls = self.calls.get(key, 0)
        if calls % self.every == 0:
            self.values[key] = gemm_peak_flops(self.dtype, self.device)
        self.calls[key] = calls + 1
        return self.values[key]


def model_flop_utilisation(num_params: int, tokens: float, seconds: float, peak_flops: float) -> float:
    """MFU = 6 N D / (t * peak): forward + backward of N parameters over D tokens against the GEMM peak."""
    return 6.0 * num_params * tokens / (seconds * peak_flops) if seconds > 0 and peak_flops > 0 else 0.0
