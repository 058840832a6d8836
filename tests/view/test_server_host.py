"""The viewer keeps its DNS-rebinding guard whatever address it binds (issue 46, item 6): it answers the names of
that address only, refuses two Host headers with 400 and an HTTP/0.9 request line with 400 at once. The real
``python -m ziprl.view`` on 127.0.0.1 and 127.0.0.2, raw sockets, bounded timeouts."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO
from ziprl.testing.viewer_data import write_run
from ziprl.view.server import host_guard, is_loopback

TIMEOUT = 10.0  # seconds a reply may take; the server's idle timeout is 30 s
_STATUS_RE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


@pytest.fixture(scope="module", params=["127.0.0.1", "127.0.0.2"])
def server(request, tmp_path_factory):
    """(address, port, stderr file) of ``python -m ziprl.view RUN --host ADDRESS --port 0``."""
    tmp = tmp_path_factory.mktemp("view-host")
    run_dir, log = write_run(tmp / "run", n=2, steps=1), tmp / "stderr.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "ziprl.view", str(run_dir), "--host", request.param, "--port",
                                 "0", "--tokenizer", "none"], stdout=subprocess.PIPE, stderr=stderr,
                                env=dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1"))
        try:
            line = proc.stdout.readline().decode()
            m = re.search(r"http://[^:]+:(\d+)/", line)
            assert m, f"no URL in {line!r}; stderr: {log.read_text()}"
            yield request.param, int(m.group(1)), log
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            proc.stdout.close()


def status(address: str, port: int, request: bytes, close: bool = True) -> int:
    """The status of the reply to ``request`` (our side closed after it unless ``close`` is false)."""
    with socket.create_connection((address, port), timeout=TIMEOUT) as sock:
        sock.sendall(request)
        if close:
            sock.shutdown(socket.SHUT_WR)
        reply = sock.recv(4096)  # a socket timeout fails the test: the server must answer without more input
    m = _STATUS_RE.match(reply)
    assert m, reply[:200]
    return int(m.group(1))


def get(server, *hosts: str) -> int:
    address, port, _ = server
    head = "GET / HTTP/1.1\r\n" + "".join(f"Host: {h.format(port=port)}\r\n" for h in hosts) + "\r\n"
    return status(address, port, head.encode())


@pytest.mark.parametrize("host", ["{address}", "{address}:{port}", "localhost", "LOCALHOST:{port}"])
def test_the_bound_address_and_localhost_are_served(server, host):
    assert get(server, host.replace("{address}", server[0])) == 200


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:{port}", "127.0.0.2.nip.io", "0.0.0.0",
                                  "localhost.attacker.example", "192.168.1.1"])
def test_foreign_hosts_are_refused(server, host):
    assert get(server, host) == 403


def test_two_host_headers_are_a_400(server):
    assert get(server, server[0], server[0]) == 400
    assert get(server, "localhost", "attacker.example") == 400
    assert get(server, server[0]) == 200


def test_an_http_0_9_request_line_is_a_400_at_once(server):
    address, port, _ = server
    assert status(address, port, b"GET /\r\n", close=False) == 400  # no blank line, the connection left open
    assert status(address, port, b"GET /api/episode/0\r\n", close=False) == 400


def test_a_loopback_address_is_no_exposure(server):
    assert "lets other machines read" not in server[2].read_text()


@pytest.mark.parametrize(("host", "address", "header", "ok"), [
    ("127.0.0.2", "127.0.0.2", "127.0.0.2:8265", True), ("127.0.0.2", "127.0.0.2", "localhost", True),
    ("127.0.0.2", "127.0.0.2", "[::1]", True), ("127.0.0.2", "127.0.0.2", "evil.example", False),
    ("::1", "::1", "[0:0:0:0:0:0:0:1]:80", True), ("::1", "::1", "[::2]", False),
    ("localhost", "127.0.0.1", "localhost", True), ("localhost", "127.0.0.1", "127.0.0.1", True),
    ("192.0.2.7", "192.0.2.7", "192.0.2.7:8265", True), ("192.0.2.7", "192.0.2.7", "localhost", False),
    ("192.0.2.7", "192.0.2.7", "192.0.2.8", False), ("192.0.2.7", "192.0.2.7", "evil.example", False),
    ("box.example", "192.0.2.7", "BOX.example:1", True),
    ("0.0.0.0", "0.0.0.0", "192.0.2.7", True), ("0.0.0.0", "0.0.0.0", "[2001:db8::1]", True),
    ("0.0.0.0", "0.0.0.0", "localhost", True), ("0.0.0.0", "0.0.0.0", "evil.example", False),
    ("0.0.0.0", "0.0.0.0", "", False), ("::", "::", "evil.example:8265", False),
])
def test_host_guard(host, address, header, ok):
    assert host_guard(host, address)(header) is ok


def test_a_wildcard_or_public_address_allows_this_machines_name():
    name = socket.gethostname()
    assert host_guard("0.0.0.0", "0.0.0.0")(name)
    assert host_guard("192.0.2.7", "192.0.2.7")(f"{name}:8265")


@pytest.mark.parametrize(("address", "loopback"), [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                                    ("0.0.0.0", False), ("192.0.2.7", False), ("fe80::1%lo", False)])
def test_is_loopback(address, loopback):
    assert is_loopback(address) is loopback
