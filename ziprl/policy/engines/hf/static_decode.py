"""Decode steps over a KV cache of fixed shape, each shape captured once as a CUDA graph: HFEngine's GPU decode loop.

A transformers decode step launches thousands of small kernels, and the plain loop reads the sampled tokens back
every step to see which rows finished. Here every tensor a step touches is allocated once (:class:`Buffers`: the
keys and values of every layer as ``[rows, positions]`` slots, the attention bias, each row's last token and
position, the cache column the step writes, the tokens drawn since the host last looked), a step reads and writes
only those, and the next token is drawn on the device from uniform numbers drawn ahead (:func:`decoding.draw`). On
CUDA a step of each shape (rows bucket, positions the attention reads, sampling mode) is captured as a CUDA graph the
first time it runs and replayed after. The host reads the drawn tokens every ``sync_every`` steps, records them (EOS,
stop strings, :class:`~ziprl.policy.decoding.DecodeRows`) and, once the rows still running fit half the bucket, moves
them to the front of a smaller one: finished rows leave the batch in buckets of powers of two. On a CPU the same steps
run without graphs, so the CPU tests cover the path.

The step computes what the model's own decoder layers compute, in fewer kernels (a GPU decode step of small kernels
costs their count as much as their bytes): each RMS norm is ``torch.rms_norm`` (one fused kernel on CUDA) times the
norm's weight, as transformers rounds it; the query, key and value projections are one matrix product, and so are the
MLP's gate and up projections (:func:`fuse_linears` makes the model's own weights views of one buffer each, so the
model and a weight refresh see them unchanged); the query and key heads, adjacent in that product's output, are
normalised (Qwen3) and rotated together, RoPE by one ``roll`` and a sine whose first half is negated once a step;
attention is one ``scaled_dot_product_attention`` over each key/value head with the query heads that share it as its
queries, masked by a bias computed once a step. The graphs read the weights where the model holds them: a weight
refresh copies into them (:meth:`HFEngine.load_weights`) and the graphs stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ziprl.config import ConfigError, SamplingConfig
from ziprl.policy.decoding import DecodeRows, draw
from ziprl.policy.side_stream import CAPTURE_LOCK

SYNC_EVERY = 16  # decode steps between the host's reads of the drawn tokens
POSITION_CHUNK = 128  # the attention reads the cache up to a multiple of this (one graph per multiple)
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # decoder layers of Llama's form (Qwen3: per-head q/k norms)
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # frequencies fixed at load (no per-step host check)


def unsupported(model: Any) -> str | None:
    """Why :class:`StaticDecode` cannot run ``model``, or None."""
    config = model.config
    if config.model_type not in MODEL_TYPES:
        return f"model_type {config.model_type!r} is not one of {', '.join(MODEL_TYPES)}"
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in ROPE_TYPES:
        return f"only RoPE types {', '.join(ROPE_TYPES)} are supported"
    if any(type(layer) is not DynamicLayer for layer in DynamicCache(config=config).layers):
        return "sliding-window attention layers are not supported"
    if any(hasattr(layer.self_attn, "q_norm") and layer.self_attn.q_norm.variance_epsilon
           != layer.self_attn.k_norm.variance_epsilon for layer in model.model.layers):
        return "query and key norms of different epsilons are not supported (they are normalised together)"
    return None


def static_decode(model: Any, setting: bool | None, pad_id: int) -> tuple[StaticDecode | None, str | None]:
    """A :class:`StaticDecode` for ``model`` as ``setting`` (``model.static_decode``) asks: None = on CUDA only;
    else None and the reason. ConfigError when it is asked for (True) and cannot run."""
    device = next(model.parameters()).device.type
    if setting is False or (setting is None and device != "cuda"):
        return None, "static_decode=false" if setting is False else f"the model is on {device} (null: on CUDA only)"
    reason = unsupported(model)
    if reason and setting:
        raise ConfigError(f"model.static_decode=true: {reason}; set model.static_decode=null or false")
    return (None, reason) if reason else (StaticDecode(model, pad_id), None)


def bucket(rows: int) -> int:
    """The batch slots ``rows`` rows run in: the next power of two."""
    return 1 << (rows - 1).bit_length()


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def rms(norm: Any, x: Tensor) -> Tensor:
    """A transformers RMS norm module's output on ``x``: normalised in float32 and rounded to ``x``'s dtype (one fused
    ``torch.rms_norm``), then times the weight."""
    return norm.weight * torch.rms_norm(x, (x.shape[-1],), None, norm.variance_epsilon)


def signed_sine(sin: Tensor) -> Tensor:
    """``sin`` with its first half negated: ``rotate(x, cos, that)`` is transformers' ``x * cos + rotate_half(x) * sin``
    (``rotate_half(x) = cat(-x2, x1)``, and ``-x2 * s1 == x2 * -s1`` exactly)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """RoPE on ``x`` (head dim last): ``roll`` by half the head dim gives ``cat(x2, x1)``."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


def grouped_attention(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scaling: float) -> Tensor:
    """``softmax(q k^T * scaling + bias) v`` for one query per row, ``q`` ``[B, 1, H, D]``, keys and values
    ``[B, H_kv, L, D]``, ``bias`` ``[B, 1, 1, L]`` (0 or -inf): one attention call whose queries are the query heads
    sharing a key/value head, so each is read once; returns ``[B, 1, H * D]``."""
    b, _, h, d = q.shape
    kv_heads = keys.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(b, kv_heads, h // kv_heads, d), keys, values, attn_mask=bias,
                                         scale=scaling)
    return out.reshape(b, 1, h * d)


def fuse_linears(linears: list[Any]) -> tuple[Tensor, Tensor | None, list[int]]:
    """One weight (and bias) for ``linears`` that read the same input, their rows stacked; each layer's own weight
    (and bias) becomes a view of it, so the model computes as before and a copy into a layer's weight reaches the
    fused one. Returns the weight, the bias (None: no layer has one) and each layer's output size."""
    sizes = [linear.out_features for linear in linears]
    biased = {linear.bias is not None for linear in linears}
    if biased == {True, False}:
        raise ValueError("fuse_linears: some of the layers have a bias and some do not")
    fused = []
    for name in ("weight", "bias") if biased == {True} else ("weight",):
        whole = torch.cat([getattr(linear, name).detach() for linear in linears])
        for linear, part in zip(linears, whole.split(sizes), strict=True):
            getattr(linear, name).data = part
        fused.append(whole)
    return fused[0], fused[1] if len(fused) > 1 else None, sizes


@dataclass
class Buffers:
    """Every tensor a decode step reads or writes (a captured graph replays on their addresses)."""

    kv: Tensor  # [layers, 2, rows, kv heads, positions, head dim]: each layer's keys and values
    bias: Tensor  # [rows, positions] model dtype: 0 at the cache positions each row attends to, -inf elsewhere
    tokens: Tensor  # [rows]: each row's last token, the next step's input
    positions: Tensor  # [rows]: its RoPE position
    column: Tensor  # [1]: the cache column the next step writes (every row's: the cache is left-padded)
    step: Tensor  # [1]: the column of ``drawn`` the next draw goes to
    uniforms: Tensor  # [rows, sync_every]: each draw's u in (0, 1]
    drawn: Tensor  # [rows, sync_every]: the tokens drawn since the host last read them
    logprobs: Tensor  # [rows, sync_every]: their raw log-probs
    temperature: Tensor  # [1]
    top_p: Tensor  # [1]

    @classmethod
    def allocate(cls, shape: tuple[int, int, int], rows: int, positions: int, window: int, dtype: torch.dtype,
                 device: torch.device) -> Buffers:
        """Buffers for ``rows`` slots of ``positions`` each, ``window`` draws between host reads; ``shape``: (layers,
        kv heads, head dim)."""
        layers, kv_heads, head_dim = shape

        def zeros(*size: int, dtype: torch.dtype = torch.float32) -> Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        return cls(zeros(layers, 2, rows, kv_heads, positions, head_dim, dtype=dtype),
                   zeros(rows, positions, dtype=dtype),
                   zeros(rows, dtype=torch.long),
                   zeros(rows, dtype=torch.long), zeros(1, dtype=torch.long), zeros(1, dtype=torch.long),
                   zeros(rows, window), zeros(rows, window, dtype=torch.long), zeros(rows, window), zeros(1), zeros(1))


class StaticDecode:
    """Decode steps of ``model`` (checked by :func:`unsupported`) over :class:`Buffers`; CUDA graphs on CUDA.

    :meth:`load` takes a prefill's cache, :meth:`decode` then draws every row's tokens into a
    :class:`~ziprl.policy.decoding.DecodeRows`. ``captures`` counts the graphs captured (a weight refresh adds none).
    """

    def __init__(self, model: Any, pad_id: int, sync_every: int = SYNC_EVERY) -> None:
        self.model, self.inner, self.head = model, model.model, model.get_output_embeddings()
        self.pad_id, self.sync_every = pad_id, sync_every
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        attn = self.inner.layers[0].self_attn
        self.head_dim, self.kv_heads = attn.head_dim, attn.k_proj.out_features // attn.head_dim
        self.heads = attn.q_proj.out_features // attn.head_dim
        self.qkv = [fuse_linears([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
                    for layer in self.inner.layers]
        self.gate_up = [fuse_linears([layer.mlp.gate_proj, layer.mlp.up_proj]) for layer in self.inner.layers]
        self.capture = self.device.type == "cuda"
        self.buffers: Buffers | None = None
        self.graphs: dict[tuple[int, int, str], torch.cuda.CUDAGraph] = {}
        self.captures = 0
        self.width = 0  # the loaded prefill's positions
        self._pool: Any = None

    def load(self, cache: Any, mask: Tensor, next_pos: Tensor, max_new_tokens: int) -> None:
        """Copy a left-padded prefill (its KV ``cache``, ``mask`` ``[B, W]``, next positions) into the buffers, which
        grow (dropping the graphs) when they hold fewer rows or positions than it and ``max_new_tokens`` need."""
        rows, self.width = mask.shape
        self._ensure(bucket(rows), round_up(self.width + max_new_tokens, POSITION_CHUNK))
        buf = self.buffers
        for i, layer in enumerate(cache.layers):
            buf.kv[i, 0, :rows, :, : self.width] = layer.keys
            buf.kv[i, 1, :rows, :, : self.width] = layer.values
        buf.bias.fill_(float("-inf"))
        buf.bias[:rows, : self.width].masked_fill_(mask.bool(), 0.0)
        buf.tokens.fill_(self.pad_id)
        buf.positions.zero_()
        buf.positions[:rows] = next_pos
        buf.column.fill_(self.width)
        buf.step.zero_()

    def decode(self, rows: DecodeRows, logits: Tensor, sampling: SamplingConfig, greedy: bool,
               gen: torch.Generator) -> None:
        """Draw each loaded row's tokens, the first from the prefill's last ``logits`` ``[B, V]``, into ``rows`` until
        every row has ended or drawn ``sampling.max_new_tokens``."""
        buf, steps, n = self.buffers, sampling.max_new_tokens, len(rows.active)
        mode = "greedy" if greedy else "nucleus" if sampling.top_p < 1.0 else "sample"
        buf.temperature.fill_(sampling.temperature)
        buf.top_p.fill_(sampling.top_p)
        slots, live, drawn, window = bucket(n), list(range(n)), 1, 1
        self._uniforms(slots, gen, greedy)
        self._draw(logits.float(), n, mode)
        while True:
            k = min(self.sync_every - window, steps - drawn)
            span = round_up(self.width + drawn + k - 1, POSITION_CHUNK)  # the last of these steps writes column -1
            for _ in range(k):
                self._run(slots, span, mode)
            drawn, window = drawn + k, window + k
            live = self._record(rows, live, window)
            if not live or drawn == steps:
                return
            if len(live) <= slots // 2:
                slots, live = self._compact(live, self.width + drawn - 1), list(range(len(live)))
            buf.step.zero_()
            window = 0
            self._uniforms(slots, gen, greedy)

    def _ensure(self, rows: int, positions: int) -> None:
        old = self.buffers
        if old is not None and old.bias.shape[0] >= rows and old.bias.shape[1] >= positions:
            return
        if old is not None:
            rows, positions = max(rows, old.bias.shape[0]), max(positions, old.bias.shape[1])
        self.graphs.clear()  # they replay on the old buffers' addresses
        self.buffers = self._pool = None
        shape = (len(self.inner.layers), self.kv_heads, self.head_dim)
        self.buffers = Buffers.allocate(shape, rows, positions, self.sync_every, self.dtype, self.device)

    def _uniforms(self, slots: int, gen: torch.Generator, greedy: bool) -> None:
        if not greedy:
            self.buffers.uniforms[:slots] = 1.0 - torch.rand((slots, self.sync_every), generator=gen,
                                                             device=self.device)

    def _draw(self, logits: Tensor, slots: int, mode: str) -> None:
        """The next token of each of the first ``slots`` rows from float32 ``logits``, with its raw log-prob."""
        buf = self.buffers
        if mode == "greedy":
            tokens = logits.argmax(dim=-1)
        else:
            u = buf.uniforms[:slots].index_select(1, buf.step)
            tokens = draw(logits, buf.temperature, buf.top_p if mode == "nucleus" else None, u)
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])
        buf.drawn[:slots].index_copy_(1, buf.step, tokens[:, None])
        buf.logprobs[:slots].index_copy_(1, buf.step, logprobs)
        buf.tokens[:slots] = tokens
        buf.step += 1

    def _run(self, slots: int, span: int, mode: str) -> None:
        """One step: eagerly on a CPU; on CUDA the graph of this shape, captured after its first (eager) run."""
        if not self.capture:
            self._step(slots, span, mode)
            return
        key = (slots, span, mode)
        if key in self.graphs:
            self.graphs[key].replay()
            return
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)  # warm-up off the main stream, as capture requires
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self._step(slots, span, mode)
        main.wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()  # one pool: the graphs never run at once
        graph = torch.cuda.CUDAGraph()
        with CAPTURE_LOCK, torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._step(slots, span, mode)  # recorded, not run
        self.graphs[key] = graph
        self.captures += 1

    def _step(self, slots: int, span: int, mode: str) -> None:
        """Feed each row's last token at its position into cache column ``column``, attend over the first ``span``
        positions, draw the next token."""
        buf = self.buffers
        buf.bias[:slots].index_fill_(1, buf.column, 0.0)
        h = self.inner.embed_tokens(buf.tokens[:slots, None])
        cos, sin = self.inner.rotary_emb(h, buf.positions[:slots, None])
        cos, sin = cos[:, :, None], signed_sine(sin)[:, :, None]  # [B, 1, 1, D]: every head
        bias = buf.bias[:slots, None, None, :span]
        for i, layer in enumerate(self.inner.layers):
            h = self._layer(i, layer, h, cos, sin, buf.kv[i, :, :slots], bias, span)
        self._draw(self.head(rms(self.inner.norm, h))[:, 0].float(), slots, mode)
        buf.positions[:slots] += 1
        buf.column += 1

    def _layer(self, i: int, layer: Any, h: Tensor, cos: Tensor, sin: Tensor, kv: Tensor, bias: Tensor, span: int
               ) -> Tensor:
        """Decoder layer ``i`` on ``h`` ``[B, 1, hidden]``, its new key and value written into ``kv`` (in place). The
        query and key heads, side by side in the fused projection's output, are normalised and rotated together."""
        attn, mlp, heads = layer.self_attn, layer.mlp, self.heads
        weight, b, _ = self.qkv[i]
        qkv = F.linear(rms(layer.input_layernorm, h), weight, b).view(h.shape[0], 1, -1, self.head_dim)
        qk, v = qkv[:, :, : heads + self.kv_heads], qkv[:, :, heads + self.kv_heads :]
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head's query and key, each with its own weight
            scale = torch.cat((attn.q_norm.weight.expand(heads, -1), attn.k_norm.weight.expand(self.kv_heads, -1)))
            qk = scale * torch.rms_norm(qk, (self.head_dim,), None, attn.q_norm.variance_epsilon)
        qk = rotate(qk, cos, sin)  # [B, 1, heads + kv heads, D]
        kv[0].index_copy_(2, self.buffers.column, qk[:, :, heads:].transpose(1, 2))
        kv[1].index_copy_(2, self.buffers.column, v.transpose(1, 2))
        h = h + attn.o_proj(grouped_attention(qk[:, :, :heads], kv[0, :, :, :span], kv[1, :, :, :span], bias,
                                              attn.scaling))
        weight, b, sizes = self.gate_up[i]
        gate, up = F.linear(rms(layer.post_attention_layernorm, h), weight, b).split(sizes, -1)
        return h + mlp.down_proj(mlp.act_fn(gate) * up)

    def _record(self, rows: DecodeRows, live: list[int], window: int) -> list[int]:
        """Record the last ``window`` draws of the ``live`` slots (the host's one read of them); the slots still
        running."""
        tokens, logprobs = self.buffers.drawn[:, :window].cpu(), self.buffers.logprobs[:, :window].cpu()
        for t in range(window):
            keep = rows.record_tokens(tokens[live, t].tolist(), logprobs[live, t].tolist())
            live = [live[j] for j in keep]
            if not live:
                break
        return live

    def _compact(self, live: list[int], columns: int) -> int:
        """Move the ``live`` slots (their first ``columns`` cache positions) to the front; the new bucket."""
        buf, n = self.buffers, len(live)
        idx = torch.tensor(live, device=self.device)
        buf.kv[:, :, :n, :, :columns] = buf.kv[:, :, idx, :, :columns]
        for t in (buf.bias, buf.tokens, buf.positions):
            t[:n] = t[idx]
        return bucket(n)
