"""DeepSpeed bootstrap: the rendezvous environment, the accelerator, no op compiled, and where a build would go.

A single process (a test, the SFT command) needs no launcher: the torch.distributed variables default to a
one-rank group on ``127.0.0.1`` and a free port; set ones are kept (``deepspeed``/``torchrun`` launchers,
and the Ray learner ranks, which ``ziprl.actors.learner_actor`` points at rank 0). A port chosen here leaves the
environment once the group has formed, so a process started later from this one forms its own group. The backend
is gloo on CPU and nccl on GPU.

No op is compiled: DeepSpeed builds its shared-memory all-reduce op (``deepspeed_shm_comm``) whenever a process forms
a group on a machine that can, ~35-100 s of g++ on two cores in every launch from an empty cache, and only its
inference all-reduce (AutoTP) uses it, which ZipRL never calls; :func:`import_deepspeed` marks it unavailable. Nor
is a CUDA op built: the trainer uses torch's AdamW, not DeepSpeed's FusedAdam, and ``DS_ACCELERATOR`` is pinned to
the configured device (``model.device``; auto = CUDA when torch sees it), so DeepSpeed neither probes nor compiles
for others. Should a DeepSpeed feature JIT-build an op, it goes to ``TORCH_EXTENSIONS_DIR``, which defaults here to
``<ZipRL cache>/torch_extensions`` (``$ZIPRL_CACHE`` or ``~/.cache/ziprl``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from ziprl.config import ModelConfig
from ziprl.paths import cache_root
from ziprl.policy.models import resolve_device

INSTALL_HINT = "the learner runs on DeepSpeed: pip install 'ziprl[deepspeed]' (DS_BUILD_OPS=0 on CPU machines)"


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_dist_env() -> None:
    """Default the torch.distributed rendezvous variables to a one-process group (set ones are kept)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)


def extensions_dir(model_cfg: ModelConfig | None = None) -> Path:
    """Where DeepSpeed's JIT-built ops live: ``$TORCH_EXTENSIONS_DIR`` if set, else the ZipRL cache."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    return cache_root((model_cfg or ModelConfig()).cache_dir) / "torch_extensions"


def import_deepspeed(model_cfg: ModelConfig | None = None) -> Any:
    """Import DeepSpeed with the accelerator and the build cache pinned; a clear error when it is missing."""
    model_cfg = model_cfg or ModelConfig()
    os.environ.setdefault("DS_ACCELERATOR", resolve_device(model_cfg.device))
    os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir(model_cfg))
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from None
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # the op nothing here calls: never built
    return deepspeed


def init_distributed(model_cfg: ModelConfig | None = None) -> Any:
    """Join (or create) the process group: gloo on CPU, nccl on GPU. Idempotent; returns ``deepspeed``."""
    import torch

    cuda = resolve_device((model_cfg or ModelConfig()).device) == "cuda"
    deepspeed = import_deepspeed(model_cfg)
    port_given = "MASTER_PORT" in os.environ
    ensure_dist_env()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not torch.distributed.is_initialized():  # the group on a store that listens on MASTER_ADDR only
        from deepspeed.constants import default_pg_timeout  # DeepSpeed's own ($DEEPSPEED_TIMEOUT minutes)

        from ziprl.weights.collective import tcp_store

        env = os.environ
        store = tcp_store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), env["RANK"] == "0",
                          default_pg_timeout)
        torch.distributed.init_process_group("nccl" if cuda else "gloo", store=store, rank=int(env["RANK"]),
                                             world_size=int(env["WORLD_SIZE"]), timeout=default_pg_timeout)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")  # adopts that group
    if not port_given:  # our store holds the port now: a child process (subprocess, Ray worker) must pick its own
        del os.environ["MASTER_PORT"]
    return deepspeed


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1
