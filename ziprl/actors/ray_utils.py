"""Start or join a Ray cluster from :class:`~ziprl.config.RayConfig`, and stop it."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import ray
from ray._private import ray_constants

from ziprl.config import ConfigError, RayConfig

# Every worker: HF tokenizers must not fork thread pools inside Ray's forked workers.
DEFAULT_ENV_VARS = {"TOKENIZERS_PARALLELISM": "false"}
# Ray's errors when a new node did not come up in time: its raylet never registered, or its GCS server never wrote
# its port file (30 s by default)
STARTUP_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")
NO_CLUSTER = "Could not find any running Ray instance"  # Ray's ConnectionError for an address "auto" that finds none
# Seconds to wait for a TCP connection to --address before saying it is unreachable (Ray itself retries for minutes)
REACH_TIMEOUT_S = 10.0
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
    A local cluster uses Ray's token authentication (Ray 2.60's default; ``cfg.auth_token=False`` opts out) and
    listens on 127.0.0.1 only (:func:`start_local_ray`); a joined cluster without token authentication gets a warning.
    No cluster at ``cfg.address``, or a ``host:port`` that takes no TCP connection (:func:`unreachable`), is a
    ConfigError naming the fix.
    """
    if ray.is_initialized():
        return
    if not cfg.auth_token:  # the documented opt-out (docs/security.md); Ray 2.60 turns tokens on by default
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    env = dict(runtime_env or {})
    env["env_vars"] = {**DEFAULT_ENV_VARS, **env.get("env_vars", {})}
    if cfg.address is None:
        start_local_ray(num_cpus=num_cpus, include_dashboard=False, runtime_env=env)
    else:
        why = unreachable(cfg.address)
        if why is not None:
            raise ConfigError(f"no Ray cluster reachable at --address {cfg.address} ({why}): check the head node's "
                              "address and port, and that it is running (`ray status` there), or drop --address to "
                              "start a local one")
        try:
            ray.init(address=cfg.address, runtime_env=env)
        except ConnectionError as exc:  # Ray's "Could not find any running Ray instance" (auto), or its GCS unreachable
            why = "" if NO_CLUSTER in str(exc) else f" ({' '.join(str(exc).split())})"
            raise ConfigError(f"no running Ray cluster at --address {cfg.address}{why}: start one (`ray start --head`, "
                              "`ray up cluster/a100x8.yaml`) or drop --address to start a local one") from None
    if cfg.auth_token and not token_auth_enabled():
        log.warning("this Ray cluster runs without token authentication: anyone who reaches its ports can run code "
                    "on it. Start it with RAY_AUTH_MODE=token (cluster/a100x8.yaml does); see docs/security.md")


def unreachable(address: str, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """Why ``address`` (``host:port`` or ``ray://host:port``) takes no TCP connection within ``timeout`` seconds, or
    None when it does. ``auto``, and an address of another form, are left to Ray (None)."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:  # refused, timed out, or a name that does not resolve
        return exc.strerror or str(exc) or type(exc).__name__
    return None


def start_local_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs)`` starting a local cluster that listens on 127.0.0.1 only (:func:`loopback_node`); when
    its raylet does not come up (once in 4 CI runs, right after another cluster stopped in the same process) or its
    GCS server does not in time (on a busy 2-core machine), stop what started and try a second time. Other errors
    raise."""
    with loopback_node():
        try:
            ray.init(**kwargs)
        except Exception as exc:
            if not any(marker in str(exc) for marker in STARTUP_TIMEOUTS):
                raise
            stop_ray()
            ray.init(**kwargs)


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """While the block starts a local cluster, its node's IP is 127.0.0.1, so that every process of it listens on
    loopback only (docs/security.md): GCS, raylet, workers, this driver, dashboard agent, runtime-env agent, metrics
    exporters.

    Ray 2.60 turns a ``_node_ip_address`` of 127.0.0.1 into the machine's external IP; it keeps loopback only where
    multi-node clusters are off (``ray_constants.ENABLE_RAY_CLUSTER``, its macOS and Windows default), and then gives
    127.0.0.1 to every process it starts, which binds it. The switch is read when the node starts and put back on
    exit, so a cluster joined later from this process is found as usual."""
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def stop_ray(local: bool = True) -> None:
    """``ray.shutdown()``. For a ``local`` cluster (one this process started) it returns once the cluster's processes
    have exited, where this Ray can wait for them (``wait_for_processes``, Ray >= 2.60): a cluster started right after
    must not meet the last one's raylet still going down. A joined cluster is only disconnected from."""
    if local and "wait_for_processes" in inspect.signature(ray.shutdown).parameters:
        ray.shutdown(wait_for_processes=True)
    else:
        ray.shutdown()


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Puts back on exit the SIGINT and SIGTERM handlers found on entry (in the main thread): ``ray.init`` installs
    a SIGTERM handler of its own, which would outlive the cluster in the process of a library caller."""
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for s, handler in saved.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be put back from here
                signal.signal(s, handler)


def token_auth_enabled() -> bool:
    """True when this process talks to Ray with token authentication on."""
    from ray._raylet import AuthenticationMode, get_authentication_mode

    return get_authentication_mode() == AuthenticationMode.TOKEN
