"""What the learner's hardware does: native bfloat16, the measured GEMM peak, model-FLOP utilisation, and the
learner settings chosen from it (:func:`choose_learner`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ziprl.config import LearnerConfig
from ziprl.policy.cpu.isa import cpu_flags, parse_flags

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 matrix instructions


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); False where it cannot tell. ``cpuinfo``
    None: this CPU, as capped by ``ONEDNN_MAX_CPU_ISA`` (:func:`~ziprl.policy.cpu.isa.cpu_flags`)."""
    flags = cpu_flags() if cpuinfo is None else parse_flags(cpuinfo)
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
    """A clock for the work queued on ``device``: on CUDA it first waits for the kernels queued on the current stream
    (they run asynchronously, so a plain clock bills a forward to whatever waits next: the loss's ``.item()``, the
    backward); not for other streams' (a rollout's beside the step, ``rollout.overlap=thread``)."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.current_stream(device).synchronize()
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


# The learner's settings on this hardware: every learner field left null is chosen from what the hardware is and how
# large the model is (:func:`choose_learner`, a pure function); a field the user set is kept.

GPU_PASS_TOKENS = 16384  # a GPU pass's token budget where memory allows (the best MFU measured: README, gpu_layout)
MIN_PASS_TOKENS = 2048  # fewer tokens a pass than this (two ~1k-token agent turns) and the plan does not fit
PASS_TOKENS_STEP = 1024  # a chosen budget is a multiple of this
GPU_USABLE = 0.8  # of a GPU's memory, what the plan fills: the CUDA context, allocator slack and the engine's KV cache
# bytes per parameter of a bf16 DeepSpeed learner at each ZeRO stage: (held whole by every rank, sharded over the
# ranks) of bf16 weights 2 + bf16 gradients 2 + float32 master weights 4 + AdamW's two float32 moments 8
STATE_BYTES = {0: (16, 0), 1: (4, 12), 2: (2, 14), 3: (0, 16)}
ENGINE_BYTES = 2  # the generation engine's bf16 copy of the weights on the same GPU (ziprl.train)


@dataclass(frozen=True)
class Hardware:
    """What the learner's settings are chosen from: the device kind, one GPU's memory, whether bf16 compute pays
    (:func:`bf16_pays`; None: not measured, the user chose) and the data-parallel learner ranks."""

    device: str  # "cpu" | "cuda"
    gpu_bytes: int = 0
    bf16_pays: bool | None = None
    ranks: int = 1


@dataclass(frozen=True)
class ModelSize:
    """What of the model the settings depend on: its parameters and the widths a training pass keeps per token."""

    params: int
    layers: int
    hidden: int
    vocab: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelSize:
        c = model.config
        return cls(sum(p.numel() for p in model.parameters()), c.num_hidden_layers, c.hidden_size, c.vocab_size)

    def activation_bytes(self) -> int:
        """Bytes a bf16 training pass keeps per token: ~34 x hidden a layer (Korthikanti et al. 2022, the attention
        scores left to SDPA) and ~10 a vocabulary entry (the logits in bf16, their float32 log-softmax and its
        gradient). Qwen3-1.7B: 3.3 MiB, against 3.1 MiB measured on an H200 (16k- and 24k-token passes)."""
        return 34 * self.layers * self.hidden + 10 * self.vocab


@dataclass(frozen=True)
class LearnerChoice:
    """The learner config with every hardware-dependent null resolved, which fields were chosen (the rest were set),
    and a warning where the plan does not fit the GPU."""

    learner: LearnerConfig
    chosen: tuple[str, ...]
    hardware: Hardware
    size: ModelSize
    warning: str = ""

    def summary(self) -> str:
        """One line: the hardware, the model and each setting, chosen or set."""
        hw, lc = self.hardware, self.learner
        where = f"{hw.device} ({hw.ranks} rank{'s' * (hw.ranks > 1)}"
        where += f", {hw.gpu_bytes / 2**30:.1f} GiB a GPU)" if hw.gpu_bytes else ")"
        values = {"bf16": "on" if lc.bf16 else "off", "micro_batch_tokens": str(lc.micro_batch_tokens),
                  "share_prefix": "on" if lc.share_prefix else "off", "pack_rows": "on" if lc.pack_rows else "off",
                  "zero_stage": str(lc.zero_stage)}
        parts = [f"{name} {value} ({'chosen' if name in self.chosen else 'set'})" for name, value in values.items()]
        line = f"[learner] {where}, {self.size.params / 1e6:,.0f}M parameters: {', '.join(parts)}"
        return line + (f"; warning: {self.warning}" if self.warning else "")


def hardware(device: str, ranks: int, measure_bf16: bool) -> Hardware:
    """The :class:`Hardware` of ``device`` ("cpu", "cuda" or "cuda:N") with ``ranks`` learner ranks; bf16's speed
    is measured (:func:`bf16_pays`) only with ``measure_bf16``."""
    cuda = device.startswith("cuda")
    memory = torch.cuda.get_device_properties(torch.device(device)).total_memory if cuda else 0
    return Hardware("cuda" if cuda else "cpu", memory, bf16_pays(device) if measure_bf16 else None, ranks)


def state_bytes(size: ModelSize, stage: int, ranks: int, bf16: bool, beta: float) -> float:
    """A GPU rank's bytes of training state at ZeRO ``stage``, with the engine's weights and, when ``beta`` > 0, the
    frozen reference model (bf16, or float32 for a float32 learner)."""
    whole, sharded = STATE_BYTES[stage]
    reference = (2 if bf16 else 4) if beta > 0 else 0
    return size.params * (whole + sharded / ranks + ENGINE_BYTES + reference)


def choose_learner(hw: Hardware, size: ModelSize, lc: LearnerConfig) -> LearnerChoice:
    """``lc`` with its null ``bf16``, ``share_prefix``, ``pack_rows``, ``zero_stage`` and ``micro_batch_tokens`` chosen
    for ``hw`` and ``size``: on a CPU bf16 where measured faster, the shared prefix, packed rows, ZeRO 0 and passes of
    micro_batch_turns turns (0); on a GPU bf16 (where supported), no shared prefix or packing, ZeRO 2 (3 when several
    ranks need the sharding to leave MIN_PASS_TOKENS of room), and a token budget of what memory holds beside the
    training state, at most GPU_PASS_TOKENS. Values the user set are kept."""
    bf16 = bool(hw.bf16_pays) if lc.bf16 is None else lc.bf16
    share_prefix = hw.device == "cpu" if lc.share_prefix is None else lc.share_prefix
    pack_rows = hw.device == "cpu" if lc.pack_rows is None else lc.pack_rows
    stage, tokens, warning = lc.zero_stage, lc.micro_batch_tokens, ""
    if hw.device == "cpu":
        stage, tokens = 0 if stage is None else stage, 0 if tokens is None else tokens
    else:
        per_token = size.activation_bytes()

        def room(z: int) -> float:  # bytes left for a pass's activations at ZeRO stage z
            return GPU_USABLE * hw.gpu_bytes - state_bytes(size, z, hw.ranks, bf16, lc.beta)

        if stage is None:
            stage = 3 if hw.ranks > 1 and room(2) < MIN_PASS_TOKENS * per_token else 2
        if tokens is None:
            fits = int(max(room(stage), 0) // per_token) // PASS_TOKENS_STEP * PASS_TOKENS_STEP
            tokens = min(max(fits, PASS_TOKENS_STEP), GPU_PASS_TOKENS)
        if room(stage) < MIN_PASS_TOKENS * per_token:
            need = state_bytes(size, stage, hw.ranks, bf16, lc.beta) + MIN_PASS_TOKENS * per_token
            warning = (f"~{need / 2**30:.0f} GiB a rank (training state, the engine's and reference's weights, a "
                       f"{MIN_PASS_TOKENS}-token pass) exceeds {GPU_USABLE:.0%} of this GPU's "
                       f"{hw.gpu_bytes / 2**30:.0f} GiB: expect out-of-memory; use more learner ranks "
                       f"(ray.learner_ranks, ZeRO-3), learner.beta=0 or a smaller model")
    chosen = tuple(name for name in ("bf16", "micro_batch_tokens", "share_prefix", "pack_rows", "zero_stage")
                   if getattr(lc, name) is None)
    learner = dataclasses.replace(lc, bf16=bf16, share_prefix=share_prefix, pack_rows=pack_rows, zero_stage=stage,
                                  micro_batch_tokens=tokens)
    return LearnerChoice(learner, chosen, hw, size, warning)
