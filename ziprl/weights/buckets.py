"""The weight wire format: versioned buckets of raw tensor bytes (bucket plans, packing, 16-bit wire dtypes).

A push is a sequence of :class:`Bucket` s. Each bucket is ONE flat ``uint8`` buffer holding several tensors
back to back (offsets aligned to :data:`ALIGN` bytes) plus a small header (:class:`TensorMeta` per tensor:
name, dtype, shape, offset) and the policy version it belongs to. Tensors travel in their wire dtype
(:func:`wire_dtype`): a bfloat16/float16 tensor is its raw 16 bits, reinterpreted on arrival with
``Tensor.view(dtype)`` (bit-exact, never widened to float32); when the rollout engine runs in 16 bits and
the learner holds float32 masters, the learner rounds to the engine's dtype before sending (the same
round-to-nearest-even cast the engine's ``load_weights`` would do on arrival, at half the bytes). Tied
weights (``lm_head.weight`` = ``model.embed_tokens.weight``) are sent once. Buckets are at most
``weights.bucket_mb`` (one larger tensor gets a bucket of its own), so the sender never holds more than one
packed bucket at a time. The transports that move buckets are :mod:`ziprl.weights.object_store` and
:mod:`ziprl.weights.collective`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

ALIGN = 64  # byte alignment of every tensor inside a bucket (any dtype may be viewed at its offset)
SIXTEEN_BIT = ("bfloat16", "float16")


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lies in its bucket's buffer."""

    name: str
    dtype: str  # torch dtype name on the wire, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int  # bytes from the buffer start (a multiple of ALIGN)
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    """One bucket of one push: the header and (object-store transport) its bytes as a numpy uint8 array."""

    version: int
    index: int
    count: int  # buckets in this push
    metas: tuple[TensorMeta, ...]
    data: np.ndarray | None = None  # None when the bytes travel separately (collective transport)

    @property
    def nbytes(self) -> int:
        return buffer_size(self.metas)

    def header(self) -> bytes:
        """The header as JSON bytes (the collective transport broadcasts it before the buffer)."""
        return json.dumps({"version": self.version, "index": self.index, "count": self.count,
                           "metas": [asdict(m) for m in self.metas]}).encode()

    @staticmethod
    def from_header(raw: bytes) -> Bucket:
        h = json.loads(raw)
        metas = tuple(TensorMeta(m["name"], m["dtype"], tuple(m["shape"]), m["offset"], m["nbytes"]) for m in h["metas"])
        return Bucket(h["version"], h["index"], h["count"], metas)


def wire_dtype(dtype: torch.dtype, engine_dtype: str) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels in to an engine running in ``engine_dtype``.

    Floating tensors go in the engine's dtype when that is 16-bit (it would cast them on arrival anyway),
    else in their own dtype (a bf16 learner to a float32 engine: 16 bits, widened exactly on arrival).
    Integer tensors travel as they are.
    """
    import torch

    if dtype.is_floating_point and engine_dtype in SIXTEEN_BIT:
        return getattr(torch, engine_dtype)
    return dtype


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def buffer_size(metas: Sequence[TensorMeta]) -> int:
    return _aligned(metas[-1].offset + metas[-1].nbytes) if metas else 0


def plan_buckets(specs: Iterable[tuple[str, str, tuple[int, ...], int]], bucket_bytes: int) -> list[tuple[TensorMeta, ...]]:
    """Group ``(name, wire dtype, shape, itemsize)`` specs, in order, into buckets of at most ``bucket_bytes``.

    A tensor larger than a bucket gets a bucket of its own; offsets are aligned to :data:`ALIGN`.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[tuple[TensorMeta, ...]] = []
    current: list[TensorMeta] = []
    for name, dtype, shape, itemsize in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        offset = buffer_size(current)
        if current and offset + nbytes > bucket_bytes:
            buckets.append(tuple(current))
            current, offset = [], 0
        current.append(TensorMeta(name, dtype, tuple(int(s) for s in shape), offset, nbytes))
    if current:
        buckets.append(tuple(current))
    return buckets


def unique_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``named`` without repeats of the same tensor object (tied weights are sent once, under the first name)."""
    seen: set[int] = set()
    out = []
    for name, t in named:
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


def full_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The whole shape of a parameter, also when ZeRO-3 holds only a partition of it (``ds_shape``)."""
    return tuple(getattr(t, "ds_shape", t.shape))


def plan_for(named: Sequence[tuple[str, torch.Tensor]], engine_dtype: str, bucket_bytes: int) -> list[tuple[TensorMeta, ...]]:
    """Bucket plan of named (possibly ZeRO-3 partitioned) tensors sent to an ``engine_dtype`` engine."""
    specs = []
    for name, t in named:
        wd = wire_dtype(t.dtype, engine_dtype)
        specs.append((name, str(wd).removeprefix("torch."), full_shape(t), wd.itemsize))
    return plan_buckets(specs, bucket_bytes)


def pack(metas: Sequence[TensorMeta], tensors: Sequence[torch.Tensor], device: Any = "cpu") -> torch.Tensor:
    """The bucket's flat uint8 buffer on ``device``: each tensor cast to its wire dtype, its raw bytes copied in."""
    import torch

    buf = torch.zeros(buffer_size(metas), dtype=torch.uint8, device=device)
    for m, t in zip(metas, tensors, strict=True):
        wd = getattr(torch, m.dtype)
        src = t.detach().to(device=device, dtype=wd).contiguous().reshape(-1)
        buf[m.offset: m.offset + m.nbytes] = src.view(torch.uint8)
    return buf


def unpack(metas: Sequence[TensorMeta], buf: Any) -> dict[str, torch.Tensor]:
    """Name -> tensor VIEWS into ``buf`` (a uint8 torch tensor or numpy array; no copy), in their wire dtype."""
    import warnings

    import torch

    if isinstance(buf, np.ndarray):
        with warnings.catch_warnings():  # object-store arrays are read-only shared memory; only read
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            buf = torch.from_numpy(buf)
    if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() < buffer_size(metas):
        raise ValueError(f"bucket buffer must be flat uint8 of {buffer_size(metas)} bytes, got {buf.dtype} {tuple(buf.shape)}")
    return {m.name: buf[m.offset: m.offset + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape) for m in metas}


def iter_packed(named: Sequence[tuple[str, torch.Tensor]], plan: Sequence[tuple[TensorMeta, ...]], gather: Any,
                device: Any = "cpu", sender: bool = True) -> Iterator[tuple[tuple[TensorMeta, ...], torch.Tensor | None]]:
    """Pack bucket by bucket; ``gather(params)`` is a context making those params whole (ZeRO-3) or a no-op.

    Only one packed bucket exists at a time. A non-``sender`` (a ZeRO-3 rank other than 0) only takes part in
    the gathers and yields None buffers.
    """
    by_name = dict(named)
    for metas in plan:
        params = [by_name[m.name] for m in metas]
        with gather(params):
            buf = pack(metas, params, device) if sender else None
        yield metas, buf
