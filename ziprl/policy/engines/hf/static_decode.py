"""Decode steps over a KV cache of fixed shape, each shape captured once as a CUDA graph: HFEngine's GPU decode loop.

A transformers decode step launches thousands of small kernels, and the plain loop reads the sampled tokens back
every step to see which rows finished. Here every tensor a step touches is allocated once (:class:`Buffers`: the
keys and values of every layer as ``[rows, positions]`` slots, the attention mask, each row's last token and
position, the cache column the step writes, the tokens drawn since the host last looked), a step reads and writes
only those, and the next token is drawn on the device from uniform numbers drawn ahead (:func:`decoding.draw`). On
CUDA a step of each shape (rows bucket, positions the attention reads, sampling mode) is captured as a CUDA graph the
first time it runs and replayed after. The host reads the drawn tokens every ``sync_every`` steps, records them (EOS,
stop strings, :class:`~ziprl.policy.decoding.DecodeRows`) and, once the rows still running fit half the bucket, moves
them to the front of a smaller one: finished rows leave the batch in buckets of powers of two. On a CPU the same steps
run without graphs, so the CPU tests cover the path.

The step computes what the model's own decoder layers compute (norms, projections, Qwen3's per-head norms and MLPs
are the model's modules; RoPE as transformers applies it; attention reads each key/value head once for the query
heads that share it). The graphs read the weights where the model holds them: a weight refresh copies into them
(:meth:`HFEngine.load_weights`) and the graphs stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ziprl.config import ConfigError, SamplingConfig
from ziprl.policy.decoding import DecodeRows, draw
from ziprl.policy.side_stream import CAPTURE_LOCK

SYNC_EVERY = 16  # decode steps between the host's reads of the drawn tokens
POSITION_CHUNK = 256  # the attention reads the cache up to a multiple of this (one graph per multiple)
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


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def grouped_attention(q: Tensor, keys: Tensor, values: Tensor, blocked: Tensor, scaling: float) -> Tensor:
    """``softmax(q k^T * scaling, masked) v`` for one query per row, ``q`` ``[B, H, 1, D]``, keys and values
    ``[B, H_kv, L, D]`` read once for the query heads that share them, ``blocked`` ``[B, 1, 1, L]`` (True: not
    attended); returns ``[B, 1, H * D]``."""
    b, h, _, d = q.shape
    kv_heads = keys.shape[1]
    q = q.reshape(b, kv_heads, h // kv_heads, d)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float() * scaling
    probs = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(b, 1, h * d)


@dataclass
class Buffers:
    """Every tensor a decode step reads or writes (a captured graph replays on their addresses)."""

    kv: Tensor  # [layers, 2, rows, kv heads, positions, head dim]: each layer's keys and values
    mask: Tensor  # [rows, positions] bool: the cache positions each row attends to
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
                   zeros(rows, positions, dtype=torch.bool), zeros(rows, dtype=torch.long),
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
        buf.mask.zero_()
        buf.mask[:rows, : self.width] = mask.bool()
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
        if old is not None and old.mask.shape[0] >= rows and old.mask.shape[1] >= positions:
            return
        if old is not None:
            rows, positions = max(rows, old.mask.shape[0]), max(positions, old.mask.shape[1])
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
        buf.mask[:slots].index_fill_(1, buf.column, True)
        h = self.inner.embed_tokens(buf.tokens[:slots, None])
        cos, sin = self.inner.rotary_emb(h, buf.positions[:slots, None])
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D]: every head
        blocked = ~buf.mask[:slots, None, None, :span]
        for i, layer in enumerate(self.inner.layers):
            h = self._layer(layer, h, cos, sin, buf.kv[i, :, :slots], blocked, span)
        self._draw(self.head(self.inner.norm(h))[:, 0].float(), slots, mode)
        buf.positions[:slots] += 1
        buf.column += 1

    def _layer(self, layer: Any, h: Tensor, cos: Tensor, sin: Tensor, kv: Tensor, blocked: Tensor, span: int
               ) -> Tensor:
        """One decoder layer on ``h`` ``[B, 1, hidden]``, its new key and value written into ``kv`` (in place)."""
        attn, shape = layer.self_attn, (h.shape[0], 1, -1, self.head_dim)
        x = layer.input_layernorm(h)
        q, k, v = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head's query and key
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        kv[0].index_copy_(2, self.buffers.column, k)
        kv[1].index_copy_(2, self.buffers.column, v)
        h = h + attn.o_proj(grouped_attention(q, kv[0, :, :, :span], kv[1, :, :, :span], blocked, attn.scaling))
        return h + layer.mlp(layer.post_attention_layernorm(h))

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
        for t in (buf.mask, buf.tokens, buf.positions):
            t[:n] = t[idx]
        return bucket(n)
