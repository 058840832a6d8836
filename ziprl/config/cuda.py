"""Whether a CUDA ``model.device`` can run on this machine, told without importing torch or initialising CUDA."""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import os
import re
import sys
from pathlib import Path


def _torch_cuda_build() -> bool | None:
    """Whether the installed torch is built for CUDA, read from its version.py (the config never imports torch);
    None when torch is missing or unreadable, or built for ROCm (whose "cuda" devices are AMD's)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = Path(next(iter(spec.submodule_search_locations)), "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    built = {k: re.search(rf"^{k}\b[^=\n]*=\s*['\"]", text, re.M) is not None for k in ("cuda", "hip")}
    return None if built["hip"] else built["cuda"]


def _nvidia_gpus() -> int:
    """The NVIDIA GPUs this process may use: counted by the driver's NVML library (which, unlike initialising CUDA,
    leaves a later fork able to use the GPU), narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it; 0 without a driver."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    count = ctypes.c_uint(0)
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return 0
    finally:
        nvml.nvmlShutdown()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count.value
    ids = list(itertools.takewhile(lambda d: d and not d.startswith("-"), (d.strip() for d in visible.split(","))))
    return min(len(ids), count.value)


def missing_cuda(device: str, address: str | None) -> str:
    """Why ``model.device`` cannot run here ('' when it can or that cannot be told): a CUDA device that the installed
    torch cannot use. Not checked without torch, off Linux, nor when joining a cluster (``ray.address``: its
    workers' GPUs are theirs)."""
    if not device.startswith("cuda") or address is not None or sys.platform != "linux":
        return ""
    cuda_build = _torch_cuda_build()
    if cuda_build is None:
        return ""
    fix = "set model.device=auto (CUDA when available) or cpu"
    if not cuda_build:
        return f"model.device={device} asks for CUDA and the installed torch is built without it; {fix}"
    count, index = _nvidia_gpus(), int(device.partition(":")[2] or 0)
    if index < count:
        return ""
    have = "none" if count == 0 else f"{count} (cuda:0{f'..cuda:{count - 1}' if count > 1 else ''})"
    return f"model.device={device} asks for a CUDA device and this machine has {have} that torch may use; {fix}"
