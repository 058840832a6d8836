"""Turn-level training rows and micro-batches; response log-probs from a causal LM.

Layout (token-aligned): a row ``input_ids = prompt_ids + response_ids`` starts at column 0 and is padded on the
right, so the forward needs no attention mask: causal attention alone keeps every real token from seeing padding
(which only follows it), the positions are 0, 1, ... as in an unpadded forward, and attention runs its mask-free
kernel (on an H100, Qwen3-1.7B: a micro-batch of left-padded prompts behind a padding mask ran the learner at 10.0k
tokens/s, unpadded ones at 18.5k). The LM head reads only the hidden states that score response tokens (gathered to a
contiguous [1, N, H] before the head, N the batch's response tokens), whatever the prompt and response lengths.

Shared prefix (``share_prefix``): the tokens every row of a micro-batch starts with (the system prompt of every
turn, ~300 of a turn's ~700 tokens with the default prompt) sit in columns 0 .. S-1 of every row; the forward runs
them once for the micro-batch and the rows attend to their repeated keys and values (``ziprl.policy.kv.prefix_cache``).
Log-probs and gradients are those of the unshared forward (to float round-off).

Packed rows (``MicroBatch.packed``, ``learner.pack_rows``): the rows' tokens after the shared prefix run as one
unpadded sequence under a mask that keeps each row to the prefix and itself (:mod:`ziprl.learner.packing`), so no
padding is computed, and with ``share_rows`` the prompt tokens a row shares with an earlier row run once; the
log-probs and gradients are again the padded forward's, to float round-off.

Every per-token tensor is indexed by column, and ``loss_mask[t] = 1`` exactly when column t holds a
response token. The log-prob at column t is log pi(input_ids[t] | input_ids[<t]), i.e. it comes from the
hidden state at t - 1 (the next-token shift is done inside ``response_logprobs``). Prompt tokens (system,
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
from typing import Any

import torch
from torch import Tensor

from ziprl.env.trajectory import Trajectory
from ziprl.learner.losses import token_weight
from ziprl.learner.packing import pack_rows, packed_length
from ziprl.policy.kv import cache_kwarg, extend_prefix, prefix_cache, shared_prefix_len


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
    """[B, T] tensors, every row from column 0 and padded on the right; per-token fields are 0 outside responses."""

    input_ids: Tensor
    attention_mask: Tensor  # 1 on real tokens (the forward itself needs no mask: padding only follows them)
    loss_mask: Tensor
    old_logp: Tensor
    adv: Tensor
    weight: Tensor
    response_starts: tuple[int, ...]  # each row's first response column
    response_ends: tuple[int, ...]  # each row's length (one past its last response column)
    prefix_len: int = 0  # columns 0 .. prefix_len - 1 hold the same tokens in every row (run once)
    packed: bool = False  # the forward runs the rows' other tokens as one unpadded sequence (ziprl.learner.packing)
    share_rows: bool = False  # packed: prompt tokens a row shares with an earlier row run once (learner.share_prefix)

    def __post_init__(self) -> None:
        """An off-by-one between the loss mask and the responses is refused where the batch is built (on the host)."""
        if self.loss_mask.device.type != "cpu":
            return
        cols = torch.arange(self.loss_mask.size(1))
        if (self.loss_mask.bool() & (cols < torch.tensor(self.response_starts)[:, None])).any():
            raise ValueError("loss mask covers a prompt token (a column before its row's response start): the mask "
                             "is shifted against the responses; build micro-batches with collate()")
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


def shared_prompt_len(rows: Sequence[TurnRow]) -> int:
    """How many leading prompt tokens all ``rows`` share, each keeping one of its own (0 for one row): what a
    micro-batch of them can run once (:func:`~ziprl.policy.kv.shared_prefix_len`)."""
    return shared_prefix_len([r.input_ids[: r.response_start] for r in rows])


def collate(rows: Sequence[TurnRow], pad_id: int, prefix_len: int = 0) -> MicroBatch:
    """Pad rows into one MicroBatch: each row from column 0, padding on the right; its first ``prefix_len`` columns,
    the same tokens in every row's prompt, are marked to run once (found by the caller, once:
    :func:`shared_prompt_len`, or a prefix shared wider than these rows, e.g. by a whole step:
    :class:`~ziprl.learner.prefix.StepPrefix`)."""
    head = rows[0].input_ids[:prefix_len]
    if prefix_len and not all(r.response_start > prefix_len and r.input_ids[:prefix_len] == head for r in rows):
        raise ValueError(f"prefix_len {prefix_len}: the rows' prompts do not all start with the same {prefix_len} "
                         "tokens and go on past them")
    b, t = len(rows), max(len(r.input_ids) for r in rows)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, t), dtype=torch.long)
    loss_mask, old_logp, adv, weight = (torch.zeros((b, t), dtype=torch.float32) for _ in range(4))
    for k, r in enumerate(rows):
        p, n = r.response_start, len(r.input_ids)
        ids[k, :n] = torch.tensor(r.input_ids, dtype=torch.long)
        attn[k, :n] = 1
        loss_mask[k, p:n] = 1.0
        old_logp[k, p:n] = torch.tensor(r.old_logp, dtype=torch.float32)
        adv[k, p:n] = r.advantage
        weight[k, p:n] = r.weight
    return MicroBatch(ids, attn, loss_mask, old_logp, adv, weight, tuple(r.response_start for r in rows),
                      tuple(len(r.input_ids) for r in rows), prefix_len)


def micro_batch_bounds(lengths: Sequence[int], micro_batch_size: int, max_tokens: int = 0) -> list[tuple[int, int]]:
    """[start, end) of each micro-batch over rows of ``lengths``, in order: ``micro_batch_size`` rows each, or with
    ``max_tokens`` > 0 as many consecutive rows as keep rows x longest row <= ``max_tokens`` (at least one)."""
    if micro_batch_size < 1 or max_tokens < 0:
        raise ValueError(f"micro_batch_size must be >= 1 and max_tokens >= 0, got {micro_batch_size}, {max_tokens}")
    if not max_tokens:
        return [(s, min(s + micro_batch_size, len(lengths))) for s in range(0, len(lengths), micro_batch_size)]
    bounds, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (i + 1 - start) * max(longest, n) > max_tokens:
            bounds.append((start, i))
            start, longest = i, 0
        longest = max(longest, n)
    return bounds + [(start, len(lengths))] if lengths else bounds


def plan_micro_batches(rows: Sequence[TurnRow], size: int, max_tokens: int = 0, overhead: int = 64
                       ) -> list[list[int]]:
    """Row indices of each micro-batch, for micro-batches that run their rows' shared leading tokens once.

    Rows are ordered by their prompts' tokens, so turns that share leading tokens sit together (a trajectory's turn
    mostly extends the one before it: ~700 of its ~750 prompt tokens in the default launch), then cut into runs of at
    most ``size`` rows (with ``max_tokens`` > 0: rows x longest <= ``max_tokens``, at least one row) where the fewest
    tokens are computed: per micro-batch its shared prefix once, every row padded to the longest, and ``overhead``
    tokens' worth for the pass itself (dynamic programming over the cuts).
    """
    if size < 1 or max_tokens < 0:
        raise ValueError(f"size must be >= 1 and max_tokens >= 0, got {size}, {max_tokens}")
    prompts = [r.input_ids[: r.response_start] for r in rows]
    order = sorted(range(len(rows)), key=prompts.__getitem__)
    common = [_common_len(prompts[a], prompts[b]) for a, b in zip(order, order[1:], strict=False)]
    best, cut = [0] + [None] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        shared, longest, shortest = None, 0, None
        for start in range(end - 1, -1, -1):
            n, row = end - start, order[start]
            longest = max(longest, len(rows[row].input_ids))
            shortest = min(len(prompts[row]), shortest or len(prompts[row]))
            if start < end - 1:
                shared = common[start] if shared is None else min(shared, common[start])
            if n > 1 and (n * longest > max_tokens if max_tokens else n > size):
                break
            m = min(shared, shortest - 1) if n > 1 else 0
            cost = best[start] + m + n * (longest - m) + overhead
            if best[end] is None or cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end:
        groups.append(order[cut[end]: end])
        end = cut[end]
    return groups[::-1]


def _common_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def make_micro_batches(rows: Sequence[TurnRow], micro_batch_size: int, pad_id: int,
                       share_prefix: bool = False) -> list[MicroBatch]:
    """Consecutive groups of ``micro_batch_size`` rows (:func:`micro_batch_bounds`), each padded to its longest; with
    ``share_prefix`` each runs the prompt tokens its rows share once."""
    bounds = micro_batch_bounds([len(r.input_ids) for r in rows], micro_batch_size)
    return [collate(rows[s:e], pad_id, shared_prompt_len(rows[s:e]) if share_prefix else 0) for s, e in bounds]


def shareable(batch: MicroBatch) -> tuple[int, ...] | None:
    """How many leading columns of each row a packed forward may share with an earlier row: its prompt, when the
    batch shares rows (:func:`~ziprl.learner.packing.share_plan`)."""
    return batch.response_starts if batch.share_rows else None


def computed_tokens(batch: MicroBatch) -> int:
    """Tokens the forward actually runs: the shared prefix once, every row's other real tokens (packed: those no
    earlier row holds)."""
    if batch.packed:
        return batch.prefix_len + packed_length(batch.input_ids, batch.response_ends, batch.prefix_len,
                                                shareable(batch))
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


def _response_logits(model: torch.nn.Module, batch: MicroBatch, temperature: float,
                     prefix: Any = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Tempered logits [N, V] predicting the batch's N response tokens, and where those tokens sit (rows, columns: the
    loss mask's nonzeros, row by row); ``prefix`` is the KV cache of the batch's shared prefix when the caller computed
    it (else it is run here)."""
    if min(batch.response_starts) < 1:
        raise ValueError("position 0 cannot be a response token: it has no context to be scored from")
    where = batch.loss_mask.nonzero(as_tuple=True)
    s, b = batch.prefix_len, 1 if batch.packed else batch.input_ids.size(0)
    if s and prefix is None:
        prefix = prefix_cache(model, batch.input_ids[:1, :s], b)
    elif s and prefix.get_seq_length() < s:  # a step's prefix (one row), then the tokens these rows share beyond it
        prefix = extend_prefix(model, prefix, batch.input_ids[:1, prefix.get_seq_length():s], b)
    cached = {cache_kwarg(model): prefix} if s else {}
    # the hidden state at column t - 1 scores the token at t; the forward's hidden states cover columns s onwards
    rows, scoring = where[0], where[1] - 1 - s
    if batch.packed:
        packed = pack_rows(batch.input_ids, batch.response_ends, s, shareable(batch))
        inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids,
                  "attention_mask": packed.attention_mask}
        at = packed.index[rows, scoring]
    else:
        inputs, at = {"input_ids": batch.input_ids[:, s:]}, rows * (batch.input_ids.size(1) - s) + scoring
    # the LM head reads only the N scoring positions, gathered to a contiguous [1, N, H]
    head = getattr(model, "module", model).get_output_embeddings()
    hook = head.register_forward_pre_hook(lambda _, args: (args[0].reshape(-1, args[0].size(-1))[at][None], *args[1:]))
    try:
        out = model(**inputs, use_cache=False, logits_to_keep=0, **cached)
    finally:
        hook.remove()
    logits = out.logits[0]
    return (logits if temperature == 1.0 else logits / temperature), where


def _place(values: Tensor, where: tuple[Tensor, Tensor], batch: MicroBatch) -> Tensor:
    """Values of the response tokens [N] at their columns ``where`` of a [B, T] tensor; 0 elsewhere."""
    return values.new_zeros(batch.input_ids.shape).index_put(where, values)


def response_logprobs(model: torch.nn.Module, batch: MicroBatch, temperature: float = 1.0,
                      prefix: Any = None) -> Tensor:
    """[B, T] log pi(token_t | tokens_<t) at response positions, 0 elsewhere (aligned with ``loss_mask``).

    ``model`` is an HF causal LM (or a wrapper forwarding ``logits_to_keep`` whose ``module`` is one, e.g. a DeepSpeed
    engine);
    logits are divided by ``temperature``, which must match how the behaviour log-probs were computed. ``prefix``: the
    KV cache of the batch's first ``prefix_len`` tokens, when computed already (:class:`~ziprl.learner.prefix.StepPrefix`).
    """
    logits, where = _response_logits(model, batch, temperature, prefix)
    return _place(token_logprobs(logits, batch.input_ids[where]), where, batch)


def response_logprobs_and_entropy(
    model: torch.nn.Module, batch: MicroBatch, temperature: float = 1.0, prefix: Any = None
) -> tuple[Tensor, Tensor]:
    """As ``response_logprobs`` plus the per-position policy entropy (no grad; for logging), one forward."""
    logits, where = _response_logits(model, batch, temperature, prefix)
    logp = _place(token_logprobs(logits, batch.input_ids[where]), where, batch)
    return logp, _place(entropy_from_logits(logits), where, batch)
