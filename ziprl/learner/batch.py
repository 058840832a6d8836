"""Turn-level training rows and micro-batches; response log-probs from a causal LM.

Layout (token-aligned): a row ``input_ids = prompt_ids + response_ids``; in a micro-batch prompts are
left-padded and responses right-padded, so every response starts at the same column P and only the
logits at columns P-1 .. T-2 are ever computed ([B, longest response, V], whatever the prompt lengths).
Position ids count real tokens only, so padding never shifts RoPE (as in ``HFEngine``'s prefill).

Shared prefix (``share_prefix``): the tokens every row of a micro-batch starts with (the system prompt of every
turn, ~300 of a turn's ~700 tokens with the default prompt) sit in columns 0 .. S-1 of every row, the padding
after them; the forward runs them once for the micro-batch and the rows attend to their repeated keys and values
(``ziprl.policy.kv.prefix_cache``). Log-probs and gradients are those of the unshared forward (to float round-off).
Every per-token tensor is indexed by column, and ``loss_mask[t] = 1`` exactly when column t holds a
response token. The log-prob at column t is log pi(input_ids[t] | input_ids[<t]), i.e. it comes from the
logits at t - 1 (the next-token shift is done inside ``response_logprobs``). Prompt tokens (system,
question, memory, observation) never carry loss.

Truncation (``max_seq_len``): a row longer than the limit loses its *leftmost prompt* tokens, never
response tokens; a response that alone needs more than ``max_seq_len - 1`` positions is an error. A
truncated row is scored under a shorter context than the one it was sampled from, so its ratio is no
longer exactly on-policy: set the limit above the longest row when possible (``TurnRow.truncated``
counts the dropped tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from ziprl.env.trajectory import Trajectory
from ziprl.learner.losses import token_weight
from ziprl.policy.kv import cache_kwarg, last_positions, prefix_cache, shared_prefix_len


@dataclass
class TurnRow:
    """One turn as a training row: ids, where its response starts, and its per-token old log-prob/adv/weight."""

    input_ids: list[int]
    response_start: int  # index of the first response token in input_ids
    old_logp: list[float]  # behaviour log-prob per response token
    advantage: float  # A_ij, broadcast to every response token of the turn
    weight: float  # loss weight per response token (losses.token_weight)
    traj_index: int  # index of the trajectory in the batch
    truncated: int = 0  # prompt tokens dropped on the left by max_seq_len


@dataclass
class MicroBatch:
    """[B, T] tensors, prompts left- and responses right-padded; per-token fields are 0 outside responses."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor  # 0, 1, ... over the real tokens of each row (0 on padding)
    loss_mask: Tensor
    old_logp: Tensor
    adv: Tensor
    weight: Tensor
    response_start: int  # the column of every row's first response token
    prefix_len: int = 0  # columns 0 .. prefix_len - 1 hold the same tokens in every row (run once)

    def __post_init__(self) -> None:
        """An off-by-one between the loss mask and the responses is refused where the batch is built (on the host)."""
        if self.loss_mask.device.type != "cpu":
            return
        if self.loss_mask[:, : self.response_start].any():
            raise ValueError("loss mask covers a prompt token (a column before response_start): the mask is shifted "
                             "against the responses; build micro-batches with collate()")
        if (self.loss_mask.bool() & ~self.attention_mask.bool()).any():
            raise ValueError("loss mask covers a padding token: the mask is shifted against the responses; build "
                             "micro-batches with collate()")

    def to(self, device: torch.device | str) -> MicroBatch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), Tensor)})


def build_rows(
    trajectories: Sequence[Trajectory],
    turn_advantages: Sequence[Sequence[float]],
    norm: str,
    max_seq_len: int | None = None,
    budget: int = 0,
) -> list[TurnRow]:
    """One row per turn with a non-empty response, for one optimiser batch (the weights normalise over it).

    ``norm="trajectory"``: weight 1/(G |o_i|) with G = len(trajectories) (the paper; equals its 1/Q sum_q 1/G
    sum_i when every group has G samples) and |o_i| the trajectory's response tokens over all turns;
    ``norm="token"``: 1/N with N all response tokens of the batch; ``norm="constant"``: 1/(G L) with L =
    ``budget``, the most response tokens a trajectory may have (Dr. GRPO).

    Trajectories of zero-variance groups (A_GRPO = 0) stay in G and N, by decision: under HRR (w > 0) their turns
    still carry w (Q_ij - Q_bar_i), and under beta > 0 every token carries the KL term, so they are rarely
    signal-free; the paper's 1/G averages over every sample of a question; and a signal-free trajectory only
    scales the step, which Adam's per-parameter normalisation absorbs. To train on signal-carrying groups only,
    drop the others from the batch (``learner.drop_zero_variance_groups``, DAPO's dynamic sampling).
    """
    if len(trajectories) != len(turn_advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(turn_advantages)} advantage lists")
    total = sum(t.num_response_tokens for t in trajectories)
    rows = []
    for i, (traj, advs) in enumerate(zip(trajectories, turn_advantages, strict=True)):
        if len(advs) != len(traj.turns):
            raise ValueError(f"trajectory {i} has {len(traj.turns)} turns but {len(advs)} advantages")
        for j, (turn, adv) in enumerate(zip(traj.turns, advs, strict=True)):
            prompt, resp = list(turn.prompt_ids), list(turn.response_ids)
            if not resp:
                continue
            if len(turn.logprobs) != len(resp):
                raise ValueError(
                    f"trajectory {i} turn {j}: {len(turn.logprobs)} logprobs for {len(resp)} response tokens"
                )
            if not prompt:
                raise ValueError(
                    f"trajectory {i} turn {j}: empty prompt, the first response token cannot be scored"
                )
            cut = 0
            if max_seq_len is not None and len(prompt) + len(resp) > max_seq_len:
                if len(resp) > max_seq_len - 1:
                    raise ValueError(
                        f"trajectory {i} turn {j}: response of {len(resp)} tokens does not fit max_seq_len="
                        f"{max_seq_len} (response tokens are never truncated; raise max_seq_len)"
                    )
                cut = len(prompt) + len(resp) - max_seq_len
                prompt = prompt[cut:]
            rows.append(
                TurnRow(
                    input_ids=prompt + resp,
                    response_start=len(prompt),
                    old_logp=[float(x) for x in turn.logprobs],
                    advantage=float(adv),
                    weight=token_weight(traj.num_response_tokens, len(trajectories), total, norm, budget),
                    traj_index=i,
                    truncated=cut,
                )
            )
    return rows


def collate(rows: Sequence[TurnRow], pad_id: int, share_prefix: bool = False) -> MicroBatch:
    """Pad rows into one MicroBatch: prompts on the left, responses on the right, all responses at one column;
    with ``share_prefix`` the rows' common leading tokens first, then the padding."""
    s = shared_prefix_len([r.input_ids[: r.response_start] for r in rows]) if share_prefix else 0
    p = max(r.response_start for r in rows)
    b, t = len(rows), p + max(len(r.input_ids) - r.response_start for r in rows)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, t), dtype=torch.long)
    loss_mask = torch.zeros((b, t), dtype=torch.float32)
    old_logp, adv, weight = (torch.zeros((b, t), dtype=torch.float32) for _ in range(3))
    for k, r in enumerate(rows):
        first, end = p - r.response_start + s, p + len(r.input_ids) - r.response_start
        ids[k, :s] = torch.tensor(r.input_ids[:s], dtype=torch.long)
        attn[k, :s] = 1
        ids[k, first:end] = torch.tensor(r.input_ids[s:], dtype=torch.long)
        attn[k, first:end] = 1
        loss_mask[k, p:end] = 1.0
        old_logp[k, p:end] = torch.tensor(r.old_logp, dtype=torch.float32)
        adv[k, p:end] = r.advantage
        weight[k, p:end] = r.weight
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(ids, attn, positions, loss_mask, old_logp, adv, weight, p, s)


def make_micro_batches(rows: Sequence[TurnRow], micro_batch_size: int, pad_id: int,
                       share_prefix: bool = False) -> list[MicroBatch]:
    """Consecutive groups of ``micro_batch_size`` rows, each padded to its own longest prompt and response."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return [collate(rows[s : s + micro_batch_size], pad_id, share_prefix)
            for s in range(0, len(rows), micro_batch_size)]


def computed_tokens(batch: MicroBatch) -> int:
    """Tokens the forward actually runs: the shared prefix once, every row's other real tokens."""
    return int(batch.attention_mask[:, batch.prefix_len :].sum()) + batch.prefix_len


def token_logprobs(logits: Tensor, targets: Tensor, chunk_rows: int = 1024) -> Tensor:
    """log softmax(logits)[target] in float32, as logit[target] - logsumexp(logits), ``chunk_rows`` rows at a time.

    Never materialises the full log-softmax; peak temporaries are one float32 chunk of [chunk_rows, V].
    """
    flat, tgt = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    out = []
    for s in range(0, flat.size(0), chunk_rows):
        z = flat[s : s + chunk_rows].float()
        out.append(z.gather(-1, tgt[s : s + chunk_rows, None]).squeeze(-1) - torch.logsumexp(z, dim=-1))
    return (
        torch.cat(out).reshape(targets.shape) if out else flat.new_zeros(targets.shape, dtype=torch.float32)
    )


@torch.no_grad()
def entropy_from_logits(logits: Tensor, chunk_rows: int = 1024) -> Tensor:
    """Per-position entropy H = logsumexp(z) - sum softmax(z) z (float32, chunked, no grad; for logging)."""
    flat = logits.reshape(-1, logits.size(-1))
    out = []
    for s in range(0, flat.size(0), chunk_rows):
        z = flat[s : s + chunk_rows].float()
        out.append(torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1))
    return torch.cat(out).reshape(logits.shape[:-1]) if out else flat.new_zeros(logits.shape[:-1])


def _response_logits(model: torch.nn.Module, batch: MicroBatch, temperature: float) -> tuple[Tensor, int]:
    """Tempered logits predicting tokens start+1 .. T-1, where start is the column before the responses."""
    if batch.response_start < 1:
        raise ValueError("position 0 cannot be a response token: it has no context to be scored from")
    start = batch.response_start - 1  # known on the host: no device sync before the forward
    keep = batch.input_ids.size(1) - start  # logits before `start` never score a response token
    s = batch.prefix_len
    keep_at = last_positions(keep, batch.input_ids.size(1) - s, batch.input_ids.device)
    if s:
        cache = prefix_cache(model, batch.input_ids[:1, :s], batch.attention_mask[:1, :s],
                             batch.position_ids[:1, :s], batch.input_ids.size(0))
        out = model(input_ids=batch.input_ids[:, s:], attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids[:, s:], use_cache=False, logits_to_keep=keep_at,
                    **{cache_kwarg(model): cache})
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False, logits_to_keep=keep_at)
    logits = out.logits[:, -keep:-1]
    return (logits if temperature == 1.0 else logits / temperature), start


def _place(values: Tensor, start: int, batch: MicroBatch) -> Tensor:
    """Shift window values to token positions [B, T]; 0 outside response positions."""
    return torch.where(
        batch.loss_mask.bool(), F.pad(values, (start + 1, 0)), torch.zeros((), device=values.device)
    )


def response_logprobs(model: torch.nn.Module, batch: MicroBatch, temperature: float = 1.0) -> Tensor:
    """[B, T] log pi(token_t | tokens_<t) at response positions, 0 elsewhere (aligned with ``loss_mask``).

    ``model`` is an HF causal LM (or a wrapper forwarding ``logits_to_keep``, e.g. a DeepSpeed engine);
    logits are divided by ``temperature``, which must match how the behaviour log-probs were computed.
    """
    logits, start = _response_logits(model, batch, temperature)
    return _place(token_logprobs(logits, batch.input_ids[:, start + 1 :]), start, batch)


def response_logprobs_and_entropy(
    model: torch.nn.Module, batch: MicroBatch, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """As ``response_logprobs`` plus the per-position policy entropy (no grad; for logging), one forward."""
    logits, start = _response_logits(model, batch, temperature)
    logp = _place(token_logprobs(logits, batch.input_ids[:, start + 1 :]), start, batch)
    return logp, _place(entropy_from_logits(logits), start, batch)
