"""Generation with HF transformers (CPU or GPU): a plain prefill + KV-cache decode loop.

Behaviour log-probs: for every generated token we record ``log_softmax(logits)[token]`` of the model's
RAW next-token distribution (temperature 1, no top-p truncation, float32, full vocabulary), whatever
temperature/top-p the token was sampled with. The learner computes pi_theta(token) from plain logits,
so the PPO ratio pi_theta / pi_old compares like with like; vLLM's default ``logprobs_mode`` ("raw_logprobs")
reports the same quantity, so both engines are interchangeable.

Stops: a sequence ends at an EOS token (kept in ``token_ids``, since the policy must learn to emit it,
dropped from ``text``), at the token that completes the first stop string (tokens after it are never
generated; ``text`` is cut right after the stop string, as vLLM's ``include_stop_str_in_output=True``
does), or after ``max_new_tokens`` (finish_reason "length"). Finished rows leave the batch (their KV
cache rows are dropped), so a batch costs what its still-running rows cost. The KV cache has room reserved
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
from ziprl.policy.cpu_attention import use_decode_attention
from ziprl.policy.engine import Generation, GenerationEngine, stop_strings
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
    A half-precision model it loads on CPU decodes with :mod:`ziprl.policy.cpu_attention` (a given model is left as is).
    """

    def __init__(self, path: str | Path | None = None, *, model: Any = None, tokenizer: Any = None,
                 dtype: str = "float32", device: str = "auto", trust_remote_code: bool = False,
                 share_prefix: bool = True, unpadded_prefill: bool | None = None) -> None:
        if model is None:
            if path is None:
                raise ValueError("HFEngine needs a model path, or a loaded model and tokenizer")
            model = load_model(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
            tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
            use_decode_attention(model)
        elif tokenizer is None:
            raise ValueError("HFEngine given a model also needs its tokenizer")
        self.model = model.eval()
        self.share_prefix = share_prefix
        self.device = next(model.parameters()).device
        # rows stack into a padded batch only from plain (full-attention) cache layers, known from the config
        plain = all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)
        self.unpadded_prefill = plain and (self.device.type == "cpu" if unpadded_prefill is None else unpadded_prefill)
        self._tokenizer = tokenizer
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        if not eos:
            raise ValueError("the model has no EOS token id (generation_config.eos_token_id / tokenizer.eos_token)")
        self.eos_ids = frozenset(eos)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
        self.weights_device = str(self.device)
        self.weights_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.version = 0
        self.tokens_generated = 0
        self.generation_seconds = 0.0
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
        gen = torch.Generator(device=self.device)
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed)
        stops = stop_strings(sampling)
        window = max((len(s.encode()) for s in stops), default=0) + 1  # tokens that can hold a stop string

        logits, cache, mask, next_pos = self._prefill(prompts, room=min(sampling.max_new_tokens, 256))

        rows = list(range(len(prompts)))  # prompt index of each row still in the batch
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        reasons = ["length"] * len(prompts)
        stopped_by_string = [False] * len(prompts)
        for step in range(sampling.max_new_tokens):
            logits = logits.float()
            next_tok = self._sample(logits, sampling, greedy, gen)
            token_lp = torch.log_softmax(logits, dim=-1).gather(1, next_tok[:, None]).squeeze(1)
            keep = []
            for j, (r, t, lp) in enumerate(zip(rows, next_tok.tolist(), token_lp.tolist(), strict=True)):
                tokens[r].append(t)
                logprobs[r].append(lp)
                if t in self.eos_ids:
                    reasons[r] = "stop"
                elif stops and self._ends_with_stop(tokens[r][-window:], stops):
                    reasons[r], stopped_by_string[r] = "stop", True
                else:
                    keep.append(j)
            if not keep or step == sampling.max_new_tokens - 1:
                break
            if len(keep) < len(rows):  # drop finished rows from the batch and the KV cache
                idx = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                mask, next_pos, next_tok = mask[idx], next_pos[idx], next_tok[idx]
                rows = [rows[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            logits = self.model(input_ids=next_tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                                use_cache=True, **{cache_kwarg(self.model): cache}).logits[:, -1, :]
            next_pos = next_pos + 1

        results = []
        for i, p in enumerate(prompts):
            text = self._tokenizer.decode(tokens[i], skip_special_tokens=True)
            if stopped_by_string[i]:
                text = text[: min(text.find(s) + len(s) for s in stops if s in text)]
            results.append(Generation(list(p), tokens[i], logprobs[i], text, reasons[i]))
        self.tokens_generated += sum(len(t) for t in tokens)
        self.generation_seconds += time.perf_counter() - start
        return results

    def _prefill(self, prompts: list[list[int]], room: int) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Forward over the prompts; returns the last logits ``[B, V]``, the KV cache (with ``room`` free positions),
        the attention mask and the next positions.

        The cache is laid out left-padded, position ids counting real tokens only, so padding never shifts RoPE. With
        ``share_prefix`` the leading tokens all prompts share (the system prompt) sit first in every row, the padding
        after them, and run once for the batch. With ``unpadded_prefill`` each row's own tokens run alone, so no
        forward computes padding, and their keys and values are placed in the padded layout afterwards."""
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

    @staticmethod
    def _sample(logits: torch.Tensor, sampling: SamplingConfig, greedy: bool, gen: torch.Generator) -> torch.Tensor:
        """Next token per row: argmax, or a draw from softmax(logits / T) restricted to the top-p nucleus.

        The draw inverts the CDF with one uniform number per row (``torch.multinomial`` draws an exponential per
        vocabulary entry: 12% of a batch-8 decode step of a 49k-token vocabulary on this CPU)."""
        if greedy:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
        if sampling.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            outside = sorted_p.cumsum(dim=-1) - sorted_p > sampling.top_p  # mass before the token already >= p
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_p.masked_fill(outside, 0.0))
        cdf = probs.cumsum(dim=-1)
        # u in (0, 1] of each row's total mass: the first token whose CDF reaches it; a zero-probability token never
        # holds the first CDF value >= u > 0, so it is never drawn
        u = (1.0 - torch.rand((probs.size(0), 1), generator=gen, device=probs.device)) * cdf[:, -1:]
        return torch.searchsorted(cdf, u).clamp_(max=probs.size(-1) - 1).squeeze(1)

    def _ends_with_stop(self, tail: list[int], stops: list[str]) -> bool:
        """Whether the decoded tail contains a stop string (checked after every token, so it just completed)."""
        text = self._tokenizer.decode(tail)
        return any(s in text for s in stops)

    def load_weights(self, named_arrays: dict[str, Any], version: int) -> None:
        """Install new weights; all are checked before any is written.

        A contiguous CPU array of the parameter's own dtype is used in place, not copied: arrays that
        ``ray.get`` returns are views of the node's shared object store, so N rollout actors on a node
        share one copy and a push costs no memory traffic. The caller must not modify such arrays later.
        Anything else (another dtype, a GPU model) is cast into fresh memory.
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
                # Rebind, never write in place: the old storage may be a read-only object-store array.
                target.data = value.to(device=target.device, dtype=target.dtype).contiguous()
        self.version = version
