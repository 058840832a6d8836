"""Decode steps of a Llama model on a CPU in one C++ call: bfloat16 on a CPU with AVX-512 BF16
(``csrc/bf16_decode.cpp``), float32 on one with AVX2 and FMA only (``csrc/f32_decode_avx2.cpp``).

A transformers decode step is ~2,900 top-level torch calls (SmolLM2-135M, batch 8), its matrix products under half
of its time. :class:`FusedDecode` runs a whole step in C++: up to 8 rows against each load of weights packed once per
weight version (repacked in place after each refresh), with no horizontal sums, and the rest in float32 without an
allocator or a dispatcher in the loop. It reads and writes the engine's KV cache (:class:`ziprl.policy.kv.RoomyLayer`)
in place, so prefill stays the model's own forward. :func:`kernel_for` picks the kernel by the CPU's flags and the
model's dtype, in one place. Each kernel is its own extension, built on first use (a C++ compiler and ninja; ~30 s,
kept in :func:`build_dir`; ``scripts/setup.sh`` builds this CPU's (:func:`cpu_kernel`) with ``python -m
ziprl.policy.cpu.fused_decode``), so one failing to build leaves the other; where none can run,
:func:`fused_decode` says why and the engine keeps the model's forward.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from ziprl.outputs import locked
from ziprl.paths import cache_root
from ziprl.policy.cpu.isa import cpu_flags
from ziprl.policy.kv import RoomyLayer

CSRC = Path(__file__).with_name("csrc")


@dataclass(frozen=True)
class Kernel:
    """A C++ decode step: its extension, what it computes in, the CPU flags it needs, its packed weight layout
    ``[N/rows][K/pair][rows][pair]`` (``rows`` output columns' ``pair`` consecutive inputs per block)."""

    name: str
    source: Path
    cflags: tuple[str, ...]
    dtype: torch.dtype
    cpu_flags: tuple[str, ...]
    rows: int
    pair: int


# -fopenmp: at::parallel_for in a header runs on one thread without it
BF16 = Kernel("ziprl_bf16_decode", CSRC / "bf16_decode.cpp",
              ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma"), torch.bfloat16,
              ("avx512_bf16",), rows=16, pair=2)
F32_AVX2 = Kernel("ziprl_f32_decode_avx2", CSRC / "f32_decode_avx2.cpp", ("-O3", "-fopenmp", "-mavx2", "-mfma"),
                  torch.float32, ("avx2", "fma"), rows=8, pair=1)
KERNELS = (BF16, F32_AVX2)


def cpu_runs(kernel: Kernel) -> bool:
    """Whether this CPU has the instructions ``kernel`` is compiled for."""
    return set(kernel.cpu_flags) <= cpu_flags()


def cpu_kernel() -> Kernel | None:
    """The kernel this CPU's engines decode with: the first of :data:`KERNELS` it runs."""
    return next((kernel for kernel in KERNELS if cpu_runs(kernel)), None)


def build_dir(kernel: Kernel) -> Path:
    """Where ``kernel`` is built: inside this Python environment (it is compiled against the environment's torch)
    where that is writable, else the ZipRL cache. Not ``$TORCH_EXTENSIONS_DIR``: importing DeepSpeed sets that to the
    ZipRL cache (:func:`ziprl.learner.distributed.import_deepspeed`), which would rebuild it per cache."""
    if os.access(sys.prefix, os.W_OK):
        return Path(sys.prefix) / "share" / "ziprl" / "extensions" / kernel.name
    return cache_root() / "torch_extensions" / kernel.name


@cache
def extension(kernel: Kernel) -> Any:
    """``kernel``'s compiled extension (built once per source version, ~30 s, then loaded from :func:`build_dir`)."""
    from torch.utils.cpp_extension import load

    build = build_dir(kernel)
    with locked(build, wait=True):  # one build at a time; the OS releases it when a build is killed
        baton = build / "lock"  # torch's own lock: present now only when a build was killed mid-way
        if baton.is_file():
            print(f"[fused_decode] removing {baton}, left by a build that was stopped", file=sys.stderr, flush=True)
            baton.unlink()  # else torch would wait on it for ever
        return load(name=kernel.name, sources=[str(kernel.source)], extra_cflags=list(kernel.cflags),
                    extra_ldflags=["-fopenmp"], build_directory=str(build), verbose=False)


def unsupported(model: Any) -> str | None:
    """Why no :class:`FusedDecode` can run ``model`` (its architecture, device or widths), or None."""
    config = model.config
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if model.device.type != "cpu":
        return f"the model is on {model.device.type}, not cpu"
    biases = getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False)
    if config.model_type != "llama" or biases:
        return f"model_type {config.model_type!r}{' with biases' if biases else ''} is not a plain Llama decoder"
    if getattr(config, "hidden_act", "silu") != "silu" or rotary is None or getattr(rotary, "rope_type", "") not in (
            "default", "linear", "llama3"):
        return "only SiLU MLPs and position-independent RoPE frequencies (default, linear, llama3) are supported"
    sizes = [config.hidden_size, config.intermediate_size, config.vocab_size, _head_dim(config)]
    rows = max(k.rows for k in KERNELS)
    grouped = config.num_attention_heads % config.num_key_value_heads == 0
    if any(s % rows for s in sizes) or _head_dim(config) > 256 or not grouped:
        return f"widths (hidden, intermediate, vocabulary, head) {sizes} are not multiples of {rows} (head <= 256)"
    return None


def kernel_for(model: Any) -> tuple[Kernel | None, str | None]:
    """The kernel that decodes ``model`` on this CPU: AVX-512 BF16 runs a bfloat16 model; a CPU without it but with
    AVX2 and FMA runs a float32 one. Else None and the reason."""
    reason, kernel = unsupported(model), cpu_kernel()
    if reason:
        return None, reason
    if kernel is None:
        return None, "this CPU has neither AVX-512 BF16 nor AVX2 with FMA"
    if model.dtype != kernel.dtype:
        return None, (f"the model is {dtype_name(model.dtype)}: on this CPU ({' + '.join(kernel.cpu_flags)}) only a "
                      f"{dtype_name(kernel.dtype)} model decodes fused")
    return kernel, None


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``."""
    return str(dtype).removeprefix("torch.")


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class FusedDecode:
    """One-token decode steps of ``model`` (checked by :func:`unsupported`, in ``kernel.dtype``) through ``kernel``'s
    compiled extension ``ext``."""

    def __init__(self, model: Any, kernel: Kernel, ext: Any) -> None:
        if model.dtype != kernel.dtype:
            raise ValueError(f"{kernel.name} decodes a {dtype_name(kernel.dtype)} model, not {dtype_name(model.dtype)}")
        self.model, self.kernel, self.ext = model, kernel, ext
        c = model.config
        self.dims = [c.hidden_size, c.num_attention_heads, c.num_key_value_heads, _head_dim(c), c.intermediate_size,
                     c.vocab_size]
        self.eps = float(c.rms_norm_eps)
        rotary = model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float().contiguous()
        self.attention_scaling = float(rotary.attention_scaling)
        self.weights: list[torch.Tensor] = []
        self.pack()

    def pack(self) -> None:
        """(Re)pack the model's current weights (after every weight refresh): into the same packed buffers after the
        first time."""
        m = self.model.model
        parts: list[torch.Tensor | tuple[torch.Tensor, ...]] = [
            m.embed_tokens.weight, m.norm.weight, (self.model.get_output_embeddings().weight,)]
        for layer in m.layers:
            a, f = layer.self_attn, layer.mlp
            parts += [layer.input_layernorm.weight, (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                      (a.o_proj.weight,), layer.post_attention_layernorm.weight, (f.gate_proj.weight, f.up_proj.weight),
                      (f.down_proj.weight,)]
        old = self.weights
        self.weights = [self._packed(p, old[i] if old else None) if isinstance(p, tuple) else p.detach().contiguous()
                        for i, p in enumerate(parts)]

    def _packed(self, weights: tuple[torch.Tensor, ...], out: torch.Tensor | None) -> torch.Tensor:
        """Weights ``[N_i, K]`` stacked along N, in ``out`` (new if None) laid out ``[N/rows][K/pair][rows][pair]``."""
        k, rows, pair = weights[0].shape[1], self.kernel.rows, self.kernel.pair
        if out is None:
            out = torch.empty((sum(w.shape[0] for w in weights) // rows, k // pair, rows, pair), dtype=self.kernel.dtype)
        start = 0
        for w in weights:
            self.ext.pack_into(out, w.detach().to(self.kernel.dtype).contiguous(), start)
            start += w.shape[0] // rows
        return out

    def usable(self, cache: Any) -> bool:
        """Whether ``cache`` is one this step can write: every layer a contiguous :class:`RoomyLayer`, one length."""
        layers = getattr(cache, "layers", ())
        return (len(layers) == len(self.model.model.layers) and all(type(layer) is RoomyLayer for layer in layers)
                and len({layer._length for layer in layers}) == 1
                and all(layer._key_buf.is_contiguous() and layer._value_buf.is_contiguous() for layer in layers))

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any) -> torch.Tensor:
        """Float32 logits ``[B, V]`` after each row's token ``tokens[b]`` at ``positions[b]``; ``mask`` ``[B, L + 1]``
        (the cache's ``L`` columns and the new one); the new keys and values go into column ``L`` of the cache."""
        layers = cache.layers
        length = layers[0]._length
        if length + 1 > layers[0]._key_buf.shape[-2]:
            for layer in layers:  # full: grow every layer's room once (one copy)
                layer._set(layer.with_room(layer.keys, length + 1 + layer.room),
                           layer.with_room(layer.values, length + 1 + layer.room), length)
        logits = self.ext.step(self.weights, self.inv_freq, self.dims, self.eps, self.attention_scaling,
                               tokens.contiguous(), positions.contiguous(), mask.to(torch.long).contiguous(),
                               [layer._key_buf for layer in layers], [layer._value_buf for layer in layers], length)
        for layer in layers:
            layer._set(layer._key_buf, layer._value_buf, length + 1)
        return logits


def fused_decode(model: Any) -> tuple[FusedDecode | None, str | None]:
    """A :class:`FusedDecode` for ``model`` on this CPU (:func:`kernel_for`), or None and the reason it cannot run."""
    kernel, reason = kernel_for(model)
    if kernel is None:
        return None, reason
    try:
        ext = extension(kernel)
    except Exception as err:  # no compiler, no ninja, a failed build: the model's own forward still decodes
        return None, f"the C++ extension {kernel.name} did not build ({type(err).__name__}: " \
                     f"{str(err).splitlines()[0][:200]})"
    return FusedDecode(model, kernel, ext), None


if __name__ == "__main__":  # scripts/setup.sh: build this CPU's kernel now rather than in the first run
    kernel = cpu_kernel()
    if kernel is None:
        print("[setup] this CPU has neither AVX-512 BF16 nor AVX2 with FMA: HFEngine decodes through the model's forward")
    else:
        try:
            extension(kernel)
            print(f"[setup] fused decode steps ({kernel.name}) built in {build_dir(kernel)}")
        except Exception as err:
            print(f"[setup] warning: fused decode steps ({kernel.name}) did not build ({err}); HFEngine in "
                  f"{dtype_name(kernel.dtype)} decodes through the model's forward")
