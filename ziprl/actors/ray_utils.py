"""Start or join a Ray cluster from :class:`~ziprl.config.RayConfig`."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from ziprl.config import RayConfig

# Every worker: HF tokenizers must not fork thread pools inside Ray's forked workers.
DEFAULT_ENV_VARS = {"TOKENIZERS_PARALLELISM": "false"}
log = logging.getLogger(__name__)


def cpu_threads(cpus: float) -> int:
    """Torch threads for an actor holding ``cpus`` Ray CPUs: its whole CPUs, at least one."""
    return max(1, int(cpus))


def init_ray(cfg: RayConfig, num_cpus: int | None = None, runtime_env: dict[str, Any] | None = None) -> None:
    """Connect this process to Ray; a no-op when already connected.

    ``cfg.address`` None starts a local single-node cluster (``num_cpus`` caps it; actors then ask
    for fractional CPUs such as ``rollout_actor_cpus=0.5``); ``"auto"`` or ``"ray://host:10001"``
    joins a running cluster (e.g. one started with ``ray up cluster/a100x8.yaml``), where ZipRL is
    already installed on every node. ``runtime_env`` env_vars are merged over :data:`DEFAULT_ENV_VARS`.
    A local cluster uses Ray's token authentication (Ray 2.60's default; ``cfg.auth_token=False`` opts out); a
    joined cluster without it gets a warning.
    """
    if ray.is_initialized():
        return
    if not cfg.auth_token:  # the documented opt-out (docs/security.md); Ray 2.60 turns tokens on by default
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    env = dict(runtime_env or {})
    env["env_vars"] = {**DEFAULT_ENV_VARS, **env.get("env_vars", {})}
    if cfg.address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=env)
    else:
        ray.init(address=cfg.address, runtime_env=env)
    if cfg.auth_token and not token_auth_enabled():
        log.warning("this Ray cluster runs without token authentication: anyone who reaches its ports can run code "
                    "on it. Start it with RAY_AUTH_MODE=token (cluster/a100x8.yaml does); see docs/security.md")


def token_auth_enabled() -> bool:
    """True when this process talks to Ray with token authentication on."""
    from ray._raylet import AuthenticationMode, get_authentication_mode

    return get_authentication_mode() == AuthenticationMode.TOKEN
