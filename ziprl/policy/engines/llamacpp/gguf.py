"""HF Llama-architecture weights as a GGUF file for llama.cpp, and in-place rewrites of its tensors.

The file carries the model's hyper-parameters and no tokenizer (``tokenizer.ggml.model = "none"``: ZipRL tokenizes
with the HF tokenizer and hands llama.cpp token ids). llama.cpp maps the file (``MAP_SHARED``) and computes straight
from the mapping for float32 / bfloat16 / float16 tensors, so writing new values into the file's tensor bytes is a
weight update the loaded model sees at its next forward pass, with no reload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ziprl.boundary import UserError

# model.dtype -> the GGUF tensor type of the 2-D weights (norms stay float32, as llama.cpp's converter writes them)
GGUF_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


class UnsupportedModel(UserError, ValueError):
    """The checkpoint is not one the llama.cpp engine can export; the message names the alternative."""


def rope(config: Any) -> tuple[float, str]:
    """(RoPE base, RoPE type) of a transformers config, as transformers 5 (``rope_parameters``) or 4 states them."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return float(theta), params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))


def check_config(config: Any) -> None:
    """Raise :class:`UnsupportedModel` unless ``config`` (a transformers config) is a plain Llama decoder."""
    if config.model_type != "llama" or getattr(config, "attention_bias", False) \
            or getattr(config, "mlp_bias", False) or rope(config)[1] != "default":
        raise UnsupportedModel(
            f"model.engine=llamacpp exports Llama-architecture checkpoints without biases or RoPE scaling (the "
            f"default SmolLM2); this one is model_type={config.model_type!r}, RoPE {rope(config)[1]!r}: "
            f"use model.engine=hf")


def tensor_name(hf_name: str, tied: bool) -> str:
    """llama.cpp's name of an HF Llama parameter (``lm_head.weight`` of tied embeddings is the embedding)."""
    if hf_name == "model.embed_tokens.weight" or (tied and hf_name == "lm_head.weight"):
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    if len(parts) == 6 and parts[:2] == ["model", "layers"] and ".".join(parts[3:5]) in _LAYER:
        return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:5])]}.weight"
    if len(parts) == 5 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER:
        return f"blk.{parts[2]}.{_LAYER[parts[3]]}.weight"
    raise KeyError(f"{hf_name!r} is not a Llama parameter name (e.g. model.layers.0.self_attn.q_proj.weight)")


def rope_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rows of a q/k projection reordered from HF's rotate-half RoPE layout to llama.cpp's interleaved pairs
    (llama.cpp's ``convert_hf_to_gguf.py`` ``permute``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _convert_into(out: np.ndarray, hf_name: str, value: Any, config: Any) -> None:
    """Write one HF parameter into ``out`` as llama.cpp reads it: q/k rows in its RoPE layout, ``out``'s dtype
    (uint16 = bfloat16 bits), converted by torch in one pass."""
    t = torch.as_tensor(value)
    if hf_name.endswith("q_proj.weight"):
        t = rope_permute(t, config.num_attention_heads)
    elif hf_name.endswith("k_proj.weight"):
        t = rope_permute(t, config.num_key_value_heads)
    bf16 = out.dtype == np.uint16
    dst = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16) if bf16 else torch.from_numpy(out)
    dst.copy_(t)


def gguf_array(hf_name: str, value: Any, config: Any, dtype: str) -> np.ndarray:
    """The bytes llama.cpp reads for one HF parameter: renamed layout, ``dtype`` for matrices, float32 for norms.

    bfloat16 is returned as its raw uint16 bits (numpy has no bfloat16)."""
    shape = tuple(np.shape(value))
    matrix = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16}[dtype]
    out = np.empty(shape, np.float32 if len(shape) == 1 else matrix)
    _convert_into(out, hf_name, value, config)
    return out


def write_gguf(path: Path, config: Any, weights: dict[str, Any], dtype: str) -> None:
    """Write ``weights`` (HF names -> arrays or tensors) of the Llama ``config`` (a transformers config) to ``path``
    as a GGUF file."""
    import gguf

    check_config(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(rope(config)[0])
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(config.vocab_size)
    w.add_tokenizer_model("none")
    written = set()
    for name, value in weights.items():
        target = tensor_name(name, bool(config.tie_word_embeddings))
        if target in written:  # a tied embedding given under both names
            continue
        data = gguf_array(name, value, config, dtype)
        kind = "F32" if data.dtype == np.float32 else GGUF_DTYPES[dtype]
        w.add_tensor(target, data, raw_dtype=gguf.GGMLQuantizationType[kind])
        written.add(target)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class MappedWeights:
    """The tensors of a GGUF file written by :func:`write_gguf`, writable in place through a shared mapping."""

    def __init__(self, path: Path, config: Any, dtype: str) -> None:
        import gguf

        self.config, self.dtype = config, dtype
        self._reader = gguf.GGUFReader(str(path), "r+")
        # bfloat16 tensors come as their raw bytes; viewed as uint16 they have the weight's shape
        self._tensors = {t.name: t.data.view(np.uint16) if t.tensor_type.name == "BF16" else t.data
                         for t in self._reader.tensors}

    def targets(self, weights: dict[str, Any]) -> dict[str, np.ndarray]:
        """The file tensor each HF name writes to; raises on an unknown name, a shape the file does not hold or a
        tensor left without a value, before anything is written (a tied embedding may come under either name)."""
        tied = bool(self.config.tie_word_embeddings)
        targets = {}
        for name, value in weights.items():
            try:
                targets[name] = self._tensors[tensor_name(name, tied)]
            except KeyError:
                raise KeyError(f"load_weights: {name!r} is not a parameter of this model "
                               f"(expected HF names such as model.layers.0.self_attn.q_proj.weight)") from None
            if tuple(np.shape(value)) != tuple(targets[name].shape):
                raise ValueError(f"load_weights: {name} has shape {tuple(np.shape(value))}, "
                                 f"the model expects {tuple(targets[name].shape)}")
        covered = {id(t) for t in targets.values()}
        missing = sorted(n for n, t in self._tensors.items() if id(t) not in covered)
        if missing:
            raise KeyError(f"load_weights: no new value for {len(missing)} tensor(s), e.g. {missing[:3]}")
        return targets

    def write(self, weights: dict[str, Any]) -> None:
        """Overwrite the file's tensors with ``weights`` (all checked before any is written), each converted straight
        into the mapped bytes."""
        for name, target in self.targets(weights).items():
            _convert_into(target, name, weights[name], self.config)
