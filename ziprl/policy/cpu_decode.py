"""Decode steps of a bfloat16 Llama model on a CPU with AVX-512 BF16, in one C++ call (``csrc/bf16_decode.cpp``).

A transformers decode step is ~2,900 top-level torch calls (SmolLM2-135M, batch 8), its matrix products under half
of its time, and torch's bf16 matrix products at 8 rows stream the weights at well under the memory's rate.
:class:`FusedDecode` runs a whole step in C++: 8 rows against each 64-byte load of weights packed once per weight
version, with no horizontal sums, and the rest in float32 without an allocator or a dispatcher in the loop. It
reads and writes the engine's KV cache (:class:`ziprl.policy.kv.RoomyLayer`) in place, so prefill stays the model's
own forward. The extension builds on first use (a C++ compiler and ninja; ~30 s, kept in :func:`build_dir`;
``scripts/setup.sh`` builds it with ``python -m ziprl.policy.cpu_decode``); without them, or on another CPU or
model, :func:`fused_decode` says why and the engine keeps the model's forward.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ziprl.paths import cache_root
from ziprl.policy.kv import RoomyLayer

NAME = "ziprl_bf16_decode"
SOURCE = Path(__file__).with_name("csrc") / "bf16_decode.cpp"
ROWS = 16  # packed weights hold 16 output columns per block
# -fopenmp: at::parallel_for in a header runs on one thread without it
FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma"]


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU runs AVX-512 BF16 instructions (Linux ``/proc/cpuinfo``)."""
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def build_dir() -> Path:
    """Where the extension is built: inside this Python environment (it is compiled against the environment's torch)
    where that is writable, else the ZipRL cache. Not ``$TORCH_EXTENSIONS_DIR``: importing DeepSpeed sets that to the
    ZipRL cache (:func:`ziprl.learner.distributed.import_deepspeed`), which would rebuild it per cache."""
    if os.access(sys.prefix, os.W_OK):
        return Path(sys.prefix) / "share" / "ziprl" / "extensions" / NAME
    return cache_root() / "torch_extensions" / NAME


@lru_cache(maxsize=1)
def _extension() -> Any:
    """The compiled extension (built once per source version, ~30 s, then loaded from :func:`build_dir`)."""
    from torch.utils.cpp_extension import load

    build = build_dir()
    build.mkdir(parents=True, exist_ok=True)
    return load(name=NAME, sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                build_directory=str(build), verbose=False)


def unsupported(model: Any) -> str | None:
    """Why :class:`FusedDecode` cannot run ``model`` here, or None."""
    config = model.config
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if model.dtype != torch.bfloat16 or model.device.type != "cpu":
        return f"the model is {model.dtype} on {model.device.type}, not bfloat16 on cpu"
    biases = getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False)
    if config.model_type != "llama" or biases:
        return f"model_type {config.model_type!r}{' with biases' if biases else ''} is not a plain Llama decoder"
    if getattr(config, "hidden_act", "silu") != "silu" or rotary is None or getattr(rotary, "rope_type", "") not in (
            "default", "linear", "llama3"):
        return "only SiLU MLPs and position-independent RoPE frequencies (default, linear, llama3) are supported"
    sizes = [config.hidden_size, config.intermediate_size, config.vocab_size, _head_dim(config)]
    grouped = config.num_attention_heads % config.num_key_value_heads == 0
    if any(s % ROWS for s in sizes) or _head_dim(config) > 256 or not grouped:
        return f"widths (hidden, intermediate, vocabulary, head) {sizes} are not multiples of {ROWS} (head <= 256)"
    if not cpu_has_avx512_bf16():
        return "this CPU has no AVX-512 BF16"
    return None


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class FusedDecode:
    """One-token decode steps of ``model`` (checked by :func:`unsupported`) through the C++ extension."""

    def __init__(self, model: Any, extension: Any) -> None:
        self.model, self.ext = model, extension
        c = model.config
        self.dims = [c.hidden_size, c.num_attention_heads, c.num_key_value_heads, _head_dim(c), c.intermediate_size,
                     c.vocab_size]
        self.eps = float(c.rms_norm_eps)
        rotary = model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float().contiguous()
        self.attention_scaling = float(rotary.attention_scaling)
        self.pack()

    def pack(self) -> None:
        """(Re)pack the model's current weights (after every weight refresh)."""
        m = self.model.model
        weights = [m.embed_tokens.weight.detach().contiguous(), m.norm.weight.detach().contiguous(),
                   self._packed(self.model.get_output_embeddings().weight)]
        for layer in m.layers:
            a, f = layer.self_attn, layer.mlp
            weights += [layer.input_layernorm.weight.detach().contiguous(),
                        self._packed(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight), self._packed(a.o_proj.weight),
                        layer.post_attention_layernorm.weight.detach().contiguous(),
                        self._packed(f.gate_proj.weight, f.up_proj.weight), self._packed(f.down_proj.weight)]
        self.weights = weights

    def _packed(self, *weights: torch.Tensor) -> torch.Tensor:
        """bf16 weights ``[N_i, K]`` stacked along N, laid out ``[N/16][K/2][16][2]``: 16 output columns' pairs of
        inputs per 64 bytes."""
        k = weights[0].shape[1]
        out = torch.empty((sum(w.shape[0] for w in weights) // ROWS, k // 2, ROWS, 2), dtype=torch.bfloat16)
        start = 0
        for w in weights:
            self.ext.pack_into(out, w.detach().to(torch.bfloat16).contiguous(), start)
            start += w.shape[0] // ROWS
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
    """A :class:`FusedDecode` for ``model``, or None and the reason it cannot run here."""
    reason = unsupported(model)
    if reason:
        return None, reason
    try:
        ext = _extension()
    except Exception as err:  # no compiler, no ninja, a failed build: the model's own forward still decodes
        return None, f"the C++ extension did not build ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
    return FusedDecode(model, ext), None


if __name__ == "__main__":  # scripts/setup.sh: build the extension now rather than in the first run
    try:
        _extension()
        print(f"[setup] fused bf16 decode steps built in {build_dir()}")
    except Exception as err:
        print(f"[setup] warning: fused bf16 decode steps did not build ({err}); HFEngine bf16 decodes through the "
              f"model's forward")
