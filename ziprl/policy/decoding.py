"""What the decode loops of HFEngine (CPU or GPU) and the llama.cpp engine share: the next-token draw, the behaviour
log-prob of each token, and the per-row bookkeeping of EOS, stop strings and finish reasons.

Behaviour log-probs are ``log_softmax(logits)[token]`` of the model's RAW next-token distribution (temperature 1,
no top-p truncation, float32, full vocabulary), whatever temperature/top-p the token was drawn with: the learner
computes pi_theta(token) from plain logits, so the PPO ratio compares like with like (vLLM's default
``logprobs_mode`` "raw_logprobs" reports the same quantity).
"""

from __future__ import annotations

from typing import Any

import torch

from ziprl.config import SamplingConfig
from ziprl.policy.engine import Generation, stop_strings


def sample(logits: torch.Tensor, sampling: SamplingConfig, greedy: bool, gen: torch.Generator) -> torch.Tensor:
    """Next token per row: argmax, or a draw from softmax(logits / T) restricted to the top-p nucleus.

    The draw inverts the CDF with one uniform number per row (``torch.multinomial`` draws an exponential per
    vocabulary entry: 12% of a batch-8 decode step of a 49k-token vocabulary on this CPU)."""
    if greedy:
        return logits.argmax(dim=-1)
    u = 1.0 - torch.rand((logits.size(0), 1), generator=gen, device=logits.device)
    return draw(logits, sampling.temperature, sampling.top_p if sampling.top_p < 1.0 else None, u)


def draw(logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float | torch.Tensor | None,
         u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose CDF under softmax(logits / temperature), restricted to the ``top_p`` nucleus
    (None: the whole vocabulary), reaches ``u`` ([rows, 1], in (0, 1]) of the row's total mass. No host round trip:
    :mod:`ziprl.policy.engines.hf.static_decode` draws inside its captured steps, ``temperature`` and ``top_p`` as
    tensors."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p is not None:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(dim=-1) - sorted_p > top_p  # mass before the token already >= p
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_p.masked_fill(outside, 0.0))
    cdf = probs.cumsum(dim=-1)
    # a zero-probability token never holds the first CDF value >= u > 0, so it is never drawn
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=probs.size(-1) - 1).squeeze(1)


def eos_ids(generation_eos: int | list[int] | None, tokenizer: Any) -> frozenset[int]:
    """EOS ids: generation_config's ``eos_token_id`` (one id, a list or None) and the tokenizer's EOS."""
    eos = set(generation_eos if isinstance(generation_eos, list) else [] if generation_eos is None else [generation_eos])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    if not eos:
        raise ValueError("the model has no EOS token id (generation_config.eos_token_id / tokenizer.eos_token)")
    return frozenset(eos)


def generator(device: torch.device | str, seed: int | None) -> torch.Generator:
    """A torch generator on ``device``, seeded with ``seed`` (None = fresh entropy)."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


class DecodeRows:
    """Per-prompt tokens, behaviour log-probs and finish reasons of one batched generation.

    A sequence ends at an EOS token (kept in ``token_ids``, since the policy must learn to emit it, dropped from
    ``text``), at the token that completes the first stop string (``text`` is cut right after it, as vLLM's
    ``include_stop_str_in_output=True`` does), or after ``max_new_tokens`` (finish_reason "length").
    ``active`` lists the prompt index of each row still in the batch, in batch order.
    """

    def __init__(self, tokenizer: Any, eos_ids: frozenset[int], prompts: list[list[int]],
                 sampling: SamplingConfig) -> None:
        self.tokenizer, self.eos_ids, self.prompts = tokenizer, eos_ids, prompts
        self.stops = stop_strings(sampling)
        self.window = max((len(s.encode()) for s in self.stops), default=0) + 1  # tokens that can hold a stop string
        self.active = list(range(len(prompts)))
        self.tokens: list[list[int]] = [[] for _ in prompts]
        self.logprobs: list[list[float]] = [[] for _ in prompts]
        self.reasons = ["length"] * len(prompts)
        self.stopped_by_string = [False] * len(prompts)

    def record(self, next_tok: torch.Tensor, logits: torch.Tensor) -> list[int]:
        """Append each active row's token and its raw log-prob under ``logits`` ([rows, V], float32); returns the
        batch positions of the rows still running, which become ``active``."""
        token_lp = torch.log_softmax(logits, dim=-1).gather(1, next_tok[:, None]).squeeze(1)
        return self.record_tokens(next_tok.tolist(), token_lp.tolist())

    def record_tokens(self, tokens: list[int], logprobs: list[float]) -> list[int]:
        """:meth:`record` of tokens and their raw log-probs already computed (one per active row, in batch order)."""
        keep = []
        for j, (r, t, lp) in enumerate(zip(self.active, tokens, logprobs, strict=True)):
            self.tokens[r].append(t)
            self.logprobs[r].append(lp)
            if t in self.eos_ids:
                self.reasons[r] = "stop"
            elif self.stops and self._ends_with_stop(self.tokens[r][-self.window:]):
                self.reasons[r], self.stopped_by_string[r] = "stop", True
            else:
                keep.append(j)
        self.active = [self.active[j] for j in keep]
        return keep

    def _ends_with_stop(self, tail: list[int]) -> bool:
        """Whether the decoded tail contains a stop string (checked after every token, so it just completed); decoded
        as ``text`` is, without special tokens (vLLM's default), so a special token's own text is never a stop."""
        text = self.tokenizer.decode(tail, skip_special_tokens=True)
        return any(s in text for s in self.stops)

    def generations(self) -> list[Generation]:
        """One :class:`Generation` per prompt, text decoded without special tokens and cut after a stop string."""
        results = []
        for i, p in enumerate(self.prompts):
            text = self.tokenizer.decode(self.tokens[i], skip_special_tokens=True)
            if self.stopped_by_string[i]:
                text = text[: min(text.find(s) + len(s) for s in self.stops if s in text)]
            results.append(Generation(list(p), self.tokens[i], self.logprobs[i], text, self.reasons[i]))
        return results

    @property
    def count(self) -> int:
        """Tokens generated so far, all rows."""
        return sum(len(t) for t in self.tokens)
