"""A local Ray cluster: started a second time when its raylet did not come up; stopped once its processes exited."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from ziprl.actors import ray_utils  # noqa: E402
from ziprl.actors.ray_utils import stop_ray  # noqa: E402

NODE_PROCESSES = ("raylet", "gcs_server")  # a new cluster met the last one's raylet still going down (a CI flake)


def _node_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() in NODE_PROCESSES]


def _running(procs: list[psutil.Process]) -> list[str]:
    alive = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.name())
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.ray_cluster
def test_a_stopped_local_cluster_has_exited_and_the_next_starts_right_away():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    started = _node_processes()
    assert sorted(p.name() for p in started) == sorted(NODE_PROCESSES)
    stop_ray()
    assert _running(started) == []
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
    finally:
        stop_ray()


def test_a_joined_cluster_or_an_older_ray_is_shut_down_without_waiting(monkeypatch):
    calls = []
    monkeypatch.setattr(ray_utils.ray, "shutdown", lambda *, wait_for_processes=False: calls.append(wait_for_processes))
    stop_ray(local=False)
    stop_ray()
    assert calls == [False, True]

    def older():  # Ray before 2.60 has no wait_for_processes
        calls.append("plain")

    monkeypatch.setattr(ray_utils.ray, "shutdown", older)
    stop_ray()
    assert calls == [False, True, "plain"]


def _fake_init(monkeypatch, errors: list[Exception]) -> list:
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        if errors:
            raise errors.pop(0)

    monkeypatch.setattr(ray_utils.ray, "init", init)
    monkeypatch.setattr(ray_utils.ray, "shutdown", lambda **kwargs: calls.append("shutdown"))
    return calls


@pytest.mark.parametrize("error", ["The current node timed out during startup. This could happen ...",
                                   "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_ab12"])
def test_a_node_that_did_not_come_up_gets_one_more_start(monkeypatch, error):
    """Its raylet never registered, or its GCS server never wrote its port file."""
    calls = _fake_init(monkeypatch, [Exception(error)])
    ray_utils.start_local_ray(num_cpus=2)
    assert calls == [{"num_cpus": 2}, "shutdown", {"num_cpus": 2}]


def test_other_errors_and_a_second_timeout_are_raised(monkeypatch):
    calls = _fake_init(monkeypatch, [ValueError("num_cpus must be >= 0")])
    with pytest.raises(ValueError, match="num_cpus"):
        ray_utils.start_local_ray(num_cpus=-1)
    assert calls == [{"num_cpus": -1}]
    timeout = "The current node timed out during startup."
    calls = _fake_init(monkeypatch, [Exception(timeout), Exception(timeout)])
    with pytest.raises(Exception, match="timed out during startup"):
        ray_utils.start_local_ray()
    assert calls == [{}, "shutdown", {}]


@pytest.mark.ray_cluster
def test_the_signal_handlers_ray_installs_are_gone_once_its_cluster_is():
    """``ray.init`` puts in a SIGTERM handler of its own; :func:`signal_handlers_kept` (around ``launch``) puts the
    caller's back."""
    import signal

    from ziprl.config import RayConfig

    def mine(signum, frame):  # the caller's own handler
        pass

    saved = {s: signal.signal(s, mine) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with ray_utils.signal_handlers_kept():
            ray_utils.init_ray(RayConfig(), num_cpus=1)
            assert signal.getsignal(signal.SIGTERM) is not mine  # Ray's, while its cluster runs
            stop_ray()
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is mine
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _listening(pids: set[int]) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every TCP socket the processes ``pids`` listen on."""
    found = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found |= {(proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return found


def _loopback(ip: str) -> bool:
    import ipaddress

    addr = ipaddress.ip_address(ip.split("%")[0])
    return addr.is_loopback or getattr(addr, "ipv4_mapped", None) is not None and addr.ipv4_mapped.is_loopback


@pytest.mark.ray_cluster
def test_a_local_cluster_listens_on_loopback_only():
    """Every process of the cluster ``launch`` starts (GCS, raylet, agents, metrics exporters, workers, this driver)
    binds 127.0.0.1, none 0.0.0.0, ``::`` or the machine's IP (docs/security.md)."""
    from ziprl.config import RayConfig

    before = _listening({psutil.Process().pid})
    ray_utils.init_ray(RayConfig(), num_cpus=1)
    try:
        worker_ip = ray.get(ray.remote(lambda: ray.util.get_node_ip_address()).remote())  # a worker runs too
        procs = {p.pid for p in psutil.Process().children(recursive=True)} | {psutil.Process().pid}
        sockets = _listening(procs) - before
        assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sockets
        assert [s for s in sockets if not _loopback(s[1])] == []
        assert worker_ip == "127.0.0.1"
    finally:
        stop_ray()
    assert ray_utils.ray_constants.ENABLE_RAY_CLUSTER  # put back: a cluster joined later is found as usual


def test_unreachable_says_why_an_address_takes_no_connection_and_leaves_auto_to_ray():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert ray_utils.unreachable(f"127.0.0.1:{port}") is None
        assert ray_utils.unreachable(f"ray://127.0.0.1:{port}") is None
    why = ray_utils.unreachable(f"127.0.0.1:{port}", timeout=2)  # closed now
    assert why is not None and "refused" in why.lower(), why
    for address in ("auto", "localhost", "host:port"):
        assert ray_utils.unreachable(address) is None
