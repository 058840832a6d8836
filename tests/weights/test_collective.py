"""The weight group's rendezvous (``ziprl.weights.collective.tcp_store``): the master's store listens on the address
the group was given, not on every interface as torch's own does, and still serves its clients."""

from __future__ import annotations

from datetime import timedelta

import psutil

from ziprl.learner.distributed import free_port
from ziprl.weights.collective import tcp_store

TIMEOUT = timedelta(seconds=30)


def listening(port: int) -> list[str]:
    return sorted(c.laddr.ip for c in psutil.Process().net_connections("tcp")
                  if c.status == "LISTEN" and c.laddr.port == port)


def test_the_master_store_listens_on_its_address_only_and_serves_a_client():
    port = free_port()
    master = tcp_store("127.0.0.1", port, 2, True, TIMEOUT)
    assert listening(port) == ["127.0.0.1"]
    client = tcp_store("127.0.0.1", port, 2, False, TIMEOUT)
    client.set("version", "7")
    assert master.get("version") == b"7"
    del client, master




def test_a_host_name_that_resolves_to_loopback_here_listens_on_every_interface(monkeypatch):
    """Debian maps the machine's own name to 127.0.1.1: the other ranks may know that name as its network address,
    so such a store gets torch's own listener (every interface); ``localhost`` stays on loopback."""
    import os
    import socket

    from ziprl.weights import collective

    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real("127.0.1.1" if host == "node-a" else host,
                                                                           *a, **k))
    assert collective._listening("node-a", free_port()) is None
    fd = collective._listening("localhost", free_port())
    try:
        assert socket.socket(fileno=os.dup(fd)).getsockname()[0] == "127.0.0.1"
    finally:
        os.close(fd)
