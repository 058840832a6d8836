"""A safetensors file written with direct I/O (``O_DIRECT``) where the file system takes it.

A checkpoint is written once and not read back by this process, so its bytes need not pass through the page cache.
On a virtual machine whose host reclaims the guest's free memory, every new page-cache page is a fresh host page:
there a buffered 1.6 GB write ran at ~0.45 GB/s, the same bytes with direct I/O at 1.4-1.9 GB/s
(benchmarks/results/launch_phases.md, round 41). :func:`write_tensors` copies the file's bytes through one aligned
staging buffer into the file and falls back to safetensors' own writer where direct I/O is refused (tmpfs, macOS).
The file is byte-for-byte a safetensors file: any safetensors reader loads it.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
from collections.abc import Mapping
from itertools import chain
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ALIGN = 4096  # O_DIRECT: buffer address, file offset and length in multiples of the device's block (<= 4096)
STAGING = 16 << 20
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}


def header(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The safetensors header of ``tensors`` (in name order, no gaps): its 8-byte length, then JSON padded with spaces
    to a multiple of 8 bytes."""
    entries, offset = {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        size = t.numel() * t.element_size()
        entries[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def write_tensors(tensors: Mapping[str, torch.Tensor], path: str | Path, staging: int = STAGING) -> None:
    """Write CPU ``tensors`` to the safetensors file ``path`` with direct I/O, else with safetensors' writer; an
    OSError (a full disk) names ``path``."""
    try:
        _write_tensors(tensors, path, staging)
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc


def _write_tensors(tensors: Mapping[str, torch.Tensor], path: str | Path, staging: int) -> None:
    for name in tensors:  # checked before the file is created
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"tensor name {name!r} is not valid UTF-8 (a lone surrogate): a safetensors file cannot "
                             "hold it; rename the tensor") from exc
    if not hasattr(os, "O_DIRECT") or any(t.dtype not in DTYPES or t.device.type != "cpu" for t in tensors.values()):
        save_file(dict(tensors), str(path))
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            _write_direct(fd, tensors, staging)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        save_file(dict(tensors), str(path))  # the file system refuses direct I/O: write through the page cache


def _write_direct(fd: int, tensors: Mapping[str, torch.Tensor], staging: int) -> None:
    """The header and each tensor's bytes, in order, through one page-aligned buffer of ``staging`` bytes (a multiple
    of ALIGN); the last block is padded to ALIGN and the file cut back to its length."""
    staging = max(ALIGN, staging - staging % ALIGN)
    sources = chain([np.frombuffer(header(tensors), dtype=np.uint8)], (_bytes(tensors[n]) for n in sorted(tensors)))
    buf = mmap.mmap(-1, staging)  # not closed explicitly: it is unmapped once no view of it is left (an error's
    out = np.frombuffer(buf, dtype=np.uint8)  # traceback may hold one)
    filled = total = 0
    for src in sources:
        done = 0
        while done < src.size:
            n = min(staging - filled, src.size - done)
            out[filled: filled + n] = src[done: done + n]
            filled, done = filled + n, done + n
            if filled == staging:
                _write_all(fd, out[:staging])
                total, filled = total + staging, 0
    if filled:
        padded = filled + (-filled % ALIGN)
        out[filled:padded] = 0
        _write_all(fd, out[:padded])
        total += filled
    os.ftruncate(fd, total)


def _bytes(t: torch.Tensor) -> np.ndarray:
    """``t``'s bytes as a flat uint8 array (little-endian, C order; a view when ``t`` is contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def _write_all(fd: int, data: np.ndarray) -> None:
    written = 0
    while written < data.size:
        written += os.write(fd, data[written:])
