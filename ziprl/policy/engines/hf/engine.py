"""Generation with HF transformers (CPU or GPU): a plain prefill + KV-cache decode loop, or on CUDA a decode loop over
a static KV cache with its steps captured as CUDA graphs (:mod:`ziprl.policy.engines.hf.static_decode`).

Behaviour log-probs, sampling and stops are :mod:`ziprl.policy.decoding`'s (raw log-probs at temperature 1, as
vLLM's default reports them; EOS, a stop string or ``max_new_tokens`` ends a row). Finished rows leave the batch
(their KV cache rows are dropped), so a batch costs what its still-running rows cost. The KV cache has room reserved
past the prompt, so a decode step appends in place rather than copying the cache.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ziprl.config import SamplingConfig
from ziprl.policy.cpu.attention import use_decode_attention
from ziprl.policy.cpu.fused_decode import fused_decode as make_fused_decode
from ziprl.policy.cpu.linear import pack_linears, repack
from ziprl.policy.decoding import DecodeRows, eos_ids, generator, sample
from ziprl.policy.engine import Generation, GenerationEngine
from ziprl.policy.engines.hf.static_decode import static_decode as make_static_decode
from ziprl.policy.kv import (
    cache_kwarg,
    fork,
    last_positions,
    output_cache,
    prefix_cache,
    reserve_room,
    shared_prefix_len,
    stack_rows,
)
from ziprl.policy.models import load_model, load_tokenizer

# Rows are prefilled one at a time when more than this share of a padded batch prefill would be padding. Measured on
# one CPU thread, batch 8: agent turns (43% padding, 170-650 own tokens a row) 1.8x faster row by row; chat
# questions (20% padding, ~20 own tokens a row) 1.6x slower, eight forwards' fixed costs outweighing the padding.
UNPADDED_MIN_PADDING = 0.3


def padding_share(prompts: list[list[int]], prefix: int) -> float:
    """The share of padding among the positions a left-padded batch prefill computes after a shared ``prefix``."""
    own = [len(p) - prefix for p in prompts]
    return 1.0 - sum(own) / (len(own) * max(own))


class HFEngine(GenerationEngine):
    """A :class:`GenerationEngine` over a transformers causal LM.

    Give either ``path`` (a local checkpoint, loaded with ``dtype`` on ``device``; "auto" = CUDA when
    available) or an already loaded ``model`` and ``tokenizer`` (used as they are, on their device).
    ``share_prefix``: prefill the prompts' common leading tokens once per batch (same tokens and log-probs).
    ``unpadded_prefill`` (default: on CPU): prefill prompts one at a time, computing no padding, when a padded batch
    would be more than ``UNPADDED_MIN_PADDING`` padding (on a CPU a padded position costs a real token's compute; a
    GPU keeps the one padded batch; never for a model with sliding-window cache layers).
    A half-precision model it loads on CPU decodes with :mod:`ziprl.policy.cpu.attention`, a bfloat16 one with its
    linear weights packed for oneDNN (:mod:`ziprl.policy.cpu.linear`; repacked at every ``load_weights``); a given model
    is left as is. ``fused_decode``: a Llama model it loads on a CPU decodes one C++ call a step instead, in bfloat16
    on a CPU with AVX-512 BF16, else in float32 with AVX2 + FMA (:mod:`ziprl.policy.cpu.fused_decode`;
    ``fused_decode_off`` says why not where it cannot).
    ``static_decode`` (``model.static_decode``; None = on CUDA for a model it loads): decode over a static KV cache,
    CUDA graphs on CUDA, the tokens drawn on the device (:mod:`ziprl.policy.engines.hf.static_decode`;
    ``static_decode_off`` says why not). With it a weight refresh copies into the model's tensors instead of rebinding them.
    """

    def __init__(self, path: str | Path | None = None, *, model: Any = None, tokenizer: Any = None,
                 dtype: str = "float32", device: str = "auto", trust_remote_code: bool = False,
                 share_prefix: bool = True, unpadded_prefill: bool | None = None, fused_decode: bool = True,
                 static_decode: bool | None = None) -> None:
        packed, self.fused_decode, self.fused_decode_off = False, None, "given a loaded model"
        given = model is not None
        if not given:
            if path is None:
                raise ValueError("HFEngine needs a model path, or a loaded model and tokenizer")
            model = load_model(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
            tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
            use_decode_attention(model)
            self.fused_decode, self.fused_decode_off = (make_fused_decode(model) if fused_decode
                                                        else (None, "fused_decode=False"))
            packed = pack_linears(model)  # prefill too: rollout-shape prefill ran 4-5% faster from packed weights
        elif tokenizer is None:
            raise ValueError("HFEngine given a model also needs its tokenizer")
        self.packed_linears = packed
        self.model = model.eval()
        self.share_prefix = share_prefix
        self.device = next(model.parameters()).device
        # rows stack into a padded batch only from plain (full-attention) cache layers, known from the config
        plain = all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)
        self.unpadded_prefill = plain and (self.device.type == "cpu" if unpadded_prefill is None else unpadded_prefill)
        self._tokenizer = tokenizer
        self.eos_ids = eos_ids(model.generation_config.eos_token_id, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.static_decode, self.static_decode_off = (
            make_static_decode(model, static_decode, self.pad_id) if static_decode is not None or not given
            else (None, "given a loaded model"))
        self.weights_device = str(self.device)
        self.weights_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.version = 0
        self.tokens_generated = 0
        self.generation_seconds = 0.0
        self.prefill_seconds = 0.0  # the part of generation_seconds the prompts' forward took
        self.max_context = getattr(model.config, "max_position_embeddings", None)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int | None = None) -> list[Generation]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        start = time.perf_counter()
        greedy = sampling.greedy or sampling.temperature == 0
        gen = generator(self.device, seed)
        room = 0 if self.static_decode is not None else min(sampling.max_new_tokens, 256)
        cuda = self.device.type == "cuda"
        if cuda:  # the prefill is queued: timed by events, read once decoding has waited for it anyway
            marks = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            marks[0].record()
        logits, cache, mask, next_pos = self._prefill(prompts, room=room)
        if cuda:
            marks[1].record()
        else:
            self.prefill_seconds += time.perf_counter() - start
        rows = DecodeRows(self._tokenizer, self.eos_ids, prompts, sampling)
        if self.static_decode is not None:
            self.static_decode.load(cache, mask, next_pos, sampling.max_new_tokens)
            del cache  # its keys and values are in the static cache now
            self.static_decode.decode(rows, logits, sampling, greedy, gen)
        else:
            self._decode(rows, logits, cache, mask, next_pos, sampling, greedy, gen)
        if cuda:
            marks[1].synchronize()
            self.prefill_seconds += marks[0].elapsed_time(marks[1]) / 1e3
        self.tokens_generated += rows.count
        self.generation_seconds += time.perf_counter() - start
        return rows.generations()

    def _decode(self, rows: DecodeRows, logits: torch.Tensor, cache: Any, mask: torch.Tensor, next_pos: torch.Tensor,
                sampling: SamplingConfig, greedy: bool, gen: torch.Generator) -> None:
        """The plain decode loop: a forward (or a fused step) per token, finished rows dropped from the batch."""
        # dropping finished rows and growing the room keep a cache the fused step can write: check it once
        fused = self.fused_decode if self.fused_decode is not None and self.fused_decode.usable(cache) else None
        for step in range(sampling.max_new_tokens):
            logits = logits.float()
            next_tok = sample(logits, sampling, greedy, gen)
            keep = rows.record(next_tok, logits)
            if not keep or step == sampling.max_new_tokens - 1:
                break
            if len(keep) < len(next_tok):  # drop finished rows from the batch and the KV cache
                idx = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                mask, next_pos, next_tok = mask[idx], next_pos[idx], next_tok[idx]
            mask = torch.cat([mask, mask.new_ones((len(keep), 1))], dim=1)
            if fused is not None:
                logits = fused(next_tok, next_pos, mask, cache)
            else:
                logits = self.model(input_ids=next_tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                                    use_cache=True, **{cache_kwarg(self.model): cache}).logits[:, -1, :]
            next_pos = next_pos + 1

    def _prefill(self, prompts: list[list[int]], room: int) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Forward over the prompts; returns the last logits ``[B, V]``, the KV cache (with ``room`` free positions),
        the attention mask and the next positions.

        The cache is laid out left-padded, position ids counting real tokens only, so padding never shifts RoPE. With
        ``share_prefix`` the leading tokens all prompts share (the system prompt) sit first in every row, the padding
        after them, and run once for the batch. With ``unpadded_prefill`` each row's own tokens run alone, so no
        forward computes padding, and their keys and values are placed in the padded layout afterwards. A prompt that
        comes more than once (GRPO's G samples of it) is prefilled once and its cache rows repeated."""
        distinct = list(dict.fromkeys(map(tuple, prompts)))
        if len(distinct) < len(prompts):
            logits, cache, mask, next_pos = self._prefill([list(p) for p in distinct], room)
            where = {p: i for i, p in enumerate(distinct)}
            idx = torch.tensor([where[tuple(p)] for p in prompts], device=self.device)
            cache.batch_select_indices(idx)
            return logits[idx], cache, mask[idx], next_pos[idx]
        s = shared_prefix_len(prompts) if self.share_prefix else 0
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, :s], mask[i, :s] = torch.tensor(p[:s], dtype=torch.long), 1
            ids[i, width - len(p) + s:] = torch.tensor(p[s:], dtype=torch.long)
            mask[i, width - len(p) + s:] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        next_pos = positions[:, -1] + 1
        if self.unpadded_prefill and padding_share(prompts, s) > UNPADDED_MIN_PADDING:
            last, caches = self._prefill_rows(prompts, s)
            return last, stack_rows(caches, s, width, room), mask, next_pos
        if s:
            cache = prefix_cache(self.model, ids[:1, :s], len(prompts))
            out = self.model(input_ids=ids[:, s:], attention_mask=mask, position_ids=positions[:, s:], use_cache=True,
                             logits_to_keep=last_positions(1, width - s, self.device), **{cache_kwarg(self.model): cache})
        else:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=last_positions(1, width, self.device))
        cache = output_cache(out)
        if room:
            reserve_room(cache, room)
        return out.logits[:, -1, :], cache, mask, next_pos

    def _prefill_rows(self, prompts: list[list[int]], s: int) -> tuple[torch.Tensor, list[Any]]:
        """Each prompt's tokens after the first ``s`` (run once) in a forward of its own; last logits and caches."""
        prefix = None
        if s:
            out = self.model(input_ids=torch.tensor([prompts[0][:s]], device=self.device), use_cache=True,
                             logits_to_keep=1)
            prefix = output_cache(out)
        last, caches = [], []
        for p in prompts:
            own = {cache_kwarg(self.model): fork(prefix)} if prefix is not None else {}
            out = self.model(input_ids=torch.tensor([p[s:]], device=self.device),
                             position_ids=torch.arange(s, len(p), device=self.device)[None], use_cache=True,
                             logits_to_keep=1, **own)
            last.append(out.logits[:, -1, :])
            caches.append(output_cache(out))
        return torch.cat(last), caches

    def load_weights(self, named_arrays: dict[str, Any], version: int) -> None:
        """Install new weights; all are checked before any is written.

        A contiguous CPU array of the parameter's own dtype is used in place, not copied: arrays that
        ``ray.get`` returns are views of the node's shared object store, so N rollout actors on a node
        share one copy and a push costs no memory traffic. The caller must not modify such arrays later.
        Anything else (another dtype, a GPU model) is cast into fresh memory. With ``static_decode`` every value is
        copied into the parameter's own memory instead, where the captured decode steps read it.
        Names are HF state-dict names; tied weights (e.g. ``lm_head.weight`` / ``model.embed_tokens.weight``)
        may come under either name or both. Unknown names, shape mismatches and parameters left without a
        new value raise.
        """
        targets = self.model.state_dict(keep_vars=True)
        unknown = sorted(set(named_arrays) - set(targets))
        if unknown:
            raise KeyError(f"load_weights: {len(unknown)} unknown parameter name(s), e.g. {unknown[:3]}; "
                           f"expected HF names such as {list(targets)[:2]}")
        with warnings.catch_warnings():
            # Arrays from ray.get are read-only shared memory; they are only read here.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            new = {name: torch.as_tensor(value) for name, value in named_arrays.items()}
        for name, value in new.items():
            if tuple(value.shape) != tuple(targets[name].shape):
                raise ValueError(f"load_weights: {name} has shape {tuple(value.shape)}, "
                                 f"the model expects {tuple(targets[name].shape)}")
        covered = {id(targets[name]) for name in new}
        missing = [name for name, p in self.model.named_parameters() if id(p) not in covered]
        if missing:
            raise KeyError(f"load_weights: no new value for {len(missing)} parameter(s), e.g. {missing[:3]}")
        with torch.no_grad():
            for name, value in new.items():
                target = targets[name]
                if self.static_decode is not None:  # never rebound, so never a read-only object-store array
                    target.data.copy_(value)
                else:  # rebind, never write in place: the old storage may be a read-only object-store array
                    target.data = value.to(device=target.device, dtype=target.dtype).contiguous()
        if self.packed_linears:
            repack(self.model)
        if self.fused_decode is not None:
            self.fused_decode.pack()
        self.version = version
