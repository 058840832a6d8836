"""Start or join a Ray cluster from :class:`~ziprl.config.RayConfig`."""

from __future__ import annotations

from typing import Any

import ray

from ziprl.config import RayConfig

# Every worker: HF tokenizers must not fork thread pools inside Ray's forked workers.
DEFAULT_ENV_VARS = {"TOKENIZERS_PARALLELISM": "false"}


def init_ray(cfg: RayConfig, num_cpus: int | None = None, runtime_env: dict[str, Any] | None = None) -> None:
    """Connect this process to Ray; a no-op when already connected.

    ``cfg.address`` None starts a local single-node cluster (``num_cpus`` caps it; actors then ask
    for fractional CPUs such as ``rollout_actor_cpus=0.5``); ``"auto"`` or ``"ray://host:10001"``
    joins a running cluster (e.g. one started with ``ray up cluster/a100x8.yaml``), where ZipRL is
    already installed on every node. ``runtime_env`` env_vars are merged over :data:`DEFAULT_ENV_VARS`.
    """
    if ray.is_initialized():
        return
    env = dict(runtime_env or {})
    env["env_vars"] = {**DEFAULT_ENV_VARS, **env.get("env_vars", {})}
    if cfg.address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=env)
    else:
        ray.init(address=cfg.address, runtime_env=env)
