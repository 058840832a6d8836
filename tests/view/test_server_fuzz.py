"""The viewer's HTTP server under hostile requests: the real ``python -m ziprl.view`` on 127.0.0.1, raw sockets.

Every request gets an HTTP status line within a timeout (never a dropped connection or a hang), no handler
raises (nothing on the server's stderr), and the server still answers a good request afterwards.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from ziprl.testing.viewer_data import write_run
from ziprl.view.data import load_run
from ziprl.view.server import host_name, make_server

TIMEOUT = 10.0  # seconds a reply may take
_STATUS_RE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


class Server:
    """``python -m ziprl.view RUN --port 0`` in a subprocess, its stderr in a file."""

    def __init__(self, run_dir: Path, log: Path):
        self.log = log
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        self._stderr = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "ziprl.view", str(run_dir), "--port", "0",
                                      "--tokenizer", "none"], stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        line = self.proc.stdout.readline().decode()
        m = re.search(r"http://localhost:(\d+)/", line)
        assert m, f"no URL in {line!r}; stderr: {log.read_text()}"
        self.port = int(m.group(1))
        self._seen = 0

    def new_stderr(self) -> str:
        """What the server wrote to stderr since the last call."""
        data = self.log.read_bytes()
        new, self._seen = data[self._seen:], len(data)
        return new.decode(errors="replace")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self._stderr.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("view-server")
    s = Server(write_run(tmp / "run", n=4, steps=2), tmp / "stderr.log")
    yield s
    s.close()


def exchange(port: int, request: bytes, timeout: float = TIMEOUT) -> bytes:
    """Send ``request`` on a fresh loopback connection, close our side, and read the reply to the end."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def get(port: int, path: str, host: str | None = "localhost", method: str = "GET") -> tuple[int, bytes]:
    """One HTTP/1.1 request's status and body."""
    head = f"{method} {path} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "") + "\r\n"
    reply = exchange(port, head.encode())
    m = _STATUS_RE.match(reply)
    assert m, f"no status line for {head!r}: {reply[:200]!r}"
    return int(m.group(1)), reply.partition(b"\r\n\r\n")[2]


def assert_clean(server: Server) -> None:
    err = server.new_stderr()
    assert "Traceback" not in err, err[-3000:]
    assert "Exception occurred" not in err, err[-3000:]
    assert "viewer: " not in err, err[-3000:]


@pytest.mark.parametrize(("path", "status"), [
    ("/api/episode/0", 200), ("/api/episode/00", 200), ("/api/episode/0?x=<script>", 200), ("/?a=b&c", 200),
    ("/api/episode/" + "9" * 5000, 404), ("/api/episode/" + "1" * 19, 404), ("/api/episode/-1", 404),
    ("/api/episode/1.5", 404), ("/api/episode/1e3", 404), ("/api/episode/0x1", 404), ("/api/episode/%30", 404),
    ("/api/episode/", 404), ("/api/episode/1/", 404), ("/api/episode/\u0661", 404), ("/api/episode/999999", 404),
])
def test_episode_ids(server, path, status):
    code, body = get(server.port, path)
    assert code == status
    if path.startswith("/api/episode/") and code == 404:
        assert b"no episode" in body
        assert len(body) < 300  # the id is cut, not echoed whole
    assert_clean(server)


@pytest.mark.parametrize("path", [
    "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/%252e%252e%252f%252e%252e%252fetc%252fpasswd",
    "/..%2f..%2fetc%2fpasswd", "/static/../../../../etc/passwd", "//etc/passwd", "/./index.html/..",
    "/api/episode/0/../../../etc/passwd", "/static/viewer.js", "/templates/page.html.j2", "*", "http://evil.example/",
])
def test_path_traversal_is_not_found(server, path):
    code, body = get(server.port, path)
    assert code == 404
    assert b"root:" not in body
    assert b"viewer" not in body
    assert_clean(server)


@pytest.mark.parametrize("host", ["localhost", "LocalHost", "127.0.0.1", "[::1]", "localhost:{port}",
                                  "127.0.0.1:{port}", "[::1]:{port}", "localhost:8265"])
def test_loopback_host_headers_are_accepted(server, host):
    assert get(server.port, "/", host.format(port=server.port))[0] == 200


@pytest.mark.parametrize("host", [None, "", "attacker.example", "attacker.example:{port}", "127.0.0.1.nip.io",
                                  "localhost.attacker.example", "[::1].attacker.example", "[::1]x", "[::2]",
                                  "127.0.0.1:80@attacker.example", "127.0.0.1:{port}:1", "0.0.0.0", "[::1"])
def test_foreign_host_headers_are_refused(server, host):
    host = host if host is None else host.format(port=server.port)
    assert get(server.port, "/", host)[0] == 403
    assert get(server.port, "/api/episode/0", host)[0] == 403


@pytest.mark.parametrize(("header", "name"), [
    ("localhost", "localhost"), ("[::1]", "::1"), ("[::1]:80", "::1"), ("127.0.0.1:8265", "127.0.0.1"),
    ("LOCALHOST:1", "localhost"), ("::1", "::1"), ("[::1]x", ""), ("a:b", ""), ("[::1", ""), ("", ""),
])
def test_host_name(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "CONNECT", "get"])
def test_other_methods_get_a_status(server, method):
    assert get(server.port, "/", method=method)[0] == 501
    assert_clean(server)


@pytest.mark.parametrize("request_bytes", [
    b"GET /\r\n\r\n",  # HTTP/0.9: answered with a status line all the same
    b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1x\r\n\r\n", b"GET / HTTP/2.0\r\n\r\n", b"GET / FOO/1.1\r\n\r\n",
    b"GET / HTTP/1.1 extra\r\n\r\n", b"\x00\xff\xfe GET\r\n\r\n", b"GET /\xc3\xa9\xff HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: localhost\r\nBad Header Line\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",  # too many headers: 431
    b"GET / HTTP/1.1\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n",  # one header line over the limit: 431
    b"GET /" + b"a" * 60_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",  # long but under the request-line limit
    b"GET / HTTP/1.1\r\nHost: localhost",  # the client stops mid-headers (and closes its side)
])
def test_malformed_requests_get_a_status(server, request_bytes):
    reply = exchange(server.port, request_bytes)
    assert _STATUS_RE.match(reply), reply[:200]
    assert int(_STATUS_RE.match(reply).group(1)) != 500
    assert_clean(server)


def test_request_line_over_the_limit_gets_414(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(b"GET /" + b"a" * 65_600 + b" HTTP/1.1\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.0 414 ")


_METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "get", "G\x00T", "\u00e9", ""]) | st.text(max_size=8)
_PATHS = st.sampled_from([
    "/", "/index.html", "/api/episode/0", "/api/episode/-1", "/api/episode/1.5", "/api/episode/" + "9" * 5000,
    "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/%252e%252e/etc/passwd", "/?q=%00%ff", "/api/episode/0?x=1",
    "/%ZZ", "/api/episode/%F0%9F%98%80",
]) | st.text(max_size=300).map(lambda s: "/" + s) | st.from_regex(r"/api/episode/-?[0-9]{0,30}(\.[0-9]+)?", fullmatch=True) \
    | st.integers(0, 6000).map(lambda n: "/api/episode/" + "9" * n)
_VERSIONS = st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/1.1x", "HTTP/9", "", "FOO"])
_HOSTS = st.sampled_from([None, "localhost", "127.0.0.1:1", "[::1]", "[::1]:8265", "evil.example", "", "\u00ff"])
_HEADERS = st.lists(st.tuples(st.text(max_size=20), st.text(max_size=100)), max_size=5)


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@st.composite
def requests(draw) -> bytes:
    """A request built from HTTP's parts (any of them odd), or raw bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=2000)) + b"\r\n\r\n"
    head = f"{draw(_METHODS)} {draw(_PATHS)} {draw(_VERSIONS)}".rstrip() + "\r\n"
    host = draw(_HOSTS)
    lines = ([f"Host: {host}"] if host is not None else []) + [f"{k}: {v}" for k, v in draw(_HEADERS)]
    return _encode(head + "".join(line + "\r\n" for line in lines) + "\r\n")


def _blank_first_line(request: bytes) -> bool:
    """A request whose first line holds no word: there is nothing to answer (the server closes the connection)."""
    return not request.split(b"\n", 1)[0].decode("latin-1").split()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(request=requests())
@example(request=b"GET /api/episode/" + b"9" * 5000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
@example(request=b"\x00\r\n\r\n")
@example(request=b"GET /\r\n\r\n")
def test_random_requests_get_a_status_and_no_traceback(server, request):
    reply = exchange(server.port, request)
    if _blank_first_line(request):
        assert reply == b""
        return
    m = _STATUS_RE.match(reply)
    assert m, f"no status line for {request[:200]!r}: {reply[:200]!r}"
    assert int(m.group(1)) in {200, 400, 403, 404, 414, 431, 501, 505}
    assert_clean(server)


def test_server_still_answers_after_the_fuzz(server):
    """Runs last in this file: the server survived every request above."""
    assert get(server.port, "/api/episode/1")[0] == 200
    assert get(server.port, "/")[0] == 200
    assert server.proc.poll() is None
    assert_clean(server)


def test_idle_connection_is_closed(tmp_path):
    """A client that sends half a request and waits does not hold a server thread forever."""
    import threading

    srv = make_server(load_run(write_run(tmp_path / "run", n=2, steps=1)), port=0, idle_timeout=0.5)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
            assert sock.recv(4096) == b""  # closed by the server (our 5 s timeout would raise instead)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()
