"""The engines' reference: log pi of a response from one plain teacher-forced forward pass of an ``HFEngine``'s model."""

from __future__ import annotations

import torch

from ziprl.policy import HFEngine


def teacher_forced_logprobs(engine: HFEngine, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log pi(token) at temperature 1 from one unpadded forward pass over prompt + response."""
    with torch.inference_mode():
        logits = engine.model(torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp.gather(1, torch.tensor(response)[:, None]).squeeze(1)
