"""Serve the viewer on a local port: the page at ``/``, one episode as JSON at ``/api/episode/<id>``.

Every request gets a status line: unknown paths 404, other methods 501, malformed requests 400/414/431 (HTTP/0.9
and two Host headers included), a Host header that names no address the server is bound to 403 (the DNS-rebinding
guard, :func:`host_guard`), an episode its file cannot show 422 (a JSON error naming the file). A handler never
raises to the socket server (a bug would be a 500 and one log line), and an idle connection is closed.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import re
import socket
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ziprl.boundary import one_line
from ziprl.view.data import Run, ViewerError, episode
from ziprl.view.page import assets, content_security_policy, json_safe, render_page

_EPISODE_RE = re.compile(r"/api/episode/([0-9]{1,15})")
_HOST_RE = re.compile(r"[A-Za-z0-9.\-:%_]+")  # characters of a hostname or an IP address (no spaces, no URL)
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
IDLE_TIMEOUT = 30.0  # seconds a connection may wait for the rest of its request
log = logging.getLogger(__name__)


def host_name(header: str) -> str:
    """The host of a Host header, lower-cased, without port or brackets ('[::1]:80' -> '::1'); '' if malformed."""
    h = header.strip().lower()
    if h.startswith("["):
        name, bracket, rest = h[1:].partition("]")
        return name if bracket and (rest == "" or (rest[0] == ":" and rest[1:].isdigit())) else ""
    if h.count(":") > 1:  # an unbracketed IPv6 address
        return h
    name, colon, port = h.partition(":")
    return name if not colon or port.isdigit() else ""


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback(address: str) -> bool:
    """Whether the bound ``address`` (an IP address, as ``server_address`` has it) is a loopback one."""
    ip = _ip(address.split("%", 1)[0])
    return ip is not None and ip.is_loopback


def host_guard(host: str, address: str) -> Callable[[str], bool]:
    """Whether a Host header names the server bound as ``--host host`` to ``address``: the name given and the address
    itself; for a loopback address also localhost and the other loopback names, for any other this machine's name;
    for a wildcard address (0.0.0.0, ::) both, and any IP address (no DNS name a rebinding attack could point here)."""
    ip = _ip(address.split("%", 1)[0])
    names = {host.lower(), address.lower()}
    wildcard = ip is not None and ip.is_unspecified
    if is_loopback(address) or wildcard:
        names |= set(LOCAL_HOSTS)
    if not is_loopback(address):
        names.add(socket.gethostname().lower())

    def allowed(header: str) -> bool:
        name = host_name(header)
        named = _ip(name)
        return (name in names or (named is not None and str(named) in names)
                or (wildcard and named is not None))

    return allowed


def address_family(host: str) -> socket.AddressFamily:
    """The address family to bind ``host`` with; ValueError naming the fix when it is no address at all."""
    fix = "give an address to bind such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
    if not host or not _HOST_RE.fullmatch(host):
        raise ViewerError(f"--host {host!r} is not a host name or IP address; {fix}")
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    except OSError as exc:
        raise ViewerError(f"--host {host!r} does not resolve ({exc.strerror}); {fix}") from None


def _bind_error(exc: OSError, host: str, port: int) -> ViewerError:
    if exc.errno == errno.EADDRINUSE:
        return ViewerError(f"port {port} is in use on {host}; pick another with --port N (--port 0 picks a free one)")
    if exc.errno == errno.EACCES:
        return ViewerError(f"port {port} needs privileges on {host}; use a port of 1024 or more (--port 0 picks one)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ViewerError(f"--host {host} is not an address of this machine; use 127.0.0.1 or one of its addresses")
    return ViewerError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); try --host 127.0.0.1 --port 0")


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up early is no error; anything else is one log line, not a traceback on stderr."""

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            log.error("viewer: %s from %s: %s", type(exc).__name__, client_address[0], one_line(exc))


def make_server(run: Run, host: str = "127.0.0.1", port: int = 8265,
                idle_timeout: float = IDLE_TIMEOUT) -> ThreadingHTTPServer:
    """A threaded HTTP server over ``run`` (call ``serve_forever``; ``server_address`` has the bound port).

    ValueError (naming the fix) when ``host`` is no address or ``host:port`` cannot be bound.
    """
    page = render_page(run, static=False).encode()
    csp = content_security_policy(*assets(), served=True)

    class Handler(BaseHTTPRequestHandler):
        default_request_version = "HTTP/1.0"  # so malformed and HTTP/0.9 requests get a status line too
        timeout = idle_timeout  # seconds; then the connection is closed

        def parse_request(self) -> bool:
            """http.server's, but an HTTP/0.9 request line (no version) is a 400 at once: http.server would wait
            for headers such a client never sends."""
            if len(self.raw_requestline.split()) == 2:
                self.command, self.request_version, self.close_connection = None, self.default_request_version, True
                self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
                self.send_error(400, "Bad request", "HTTP/0.9 requests are not served; send HTTP/1.0 or 1.1")
                return False
            return super().parse_request()

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Security-Policy", csp)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: object) -> None:
            self._send(status, json.dumps(obj, allow_nan=False).encode(), "application/json")

        def _route(self) -> None:
            hosts = self.headers.get_all("Host") or []
            if len(hosts) > 1:
                self.close_connection = True
                self._send(400, b"more than one Host header", "text/plain; charset=utf-8")
                return
            if not self.server.host_allowed(hosts[0] if hosts else ""):
                self._send(403, b"forbidden host", "text/plain; charset=utf-8")
                return
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(200, page, "text/html; charset=utf-8")
            elif path.startswith("/api/episode/"):
                m = _EPISODE_RE.fullmatch(path)
                episode_id = int(m.group(1)) if m else -1
                if not 0 <= episode_id < run.num_episodes:
                    shown = path.removeprefix("/api/episode/")[:40]
                    self._json(404, {"error": f"no episode {shown!r}: ids are 0..{run.num_episodes - 1}"})
                else:
                    try:
                        body = json_safe(episode(run, episode_id))
                    except ViewerError as exc:  # its file holds values the viewer cannot show
                        self._json(422, {"error": str(exc)})
                    else:
                        self._json(200, body)
            else:
                self._send(404, b"not found", "text/plain; charset=utf-8")

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            try:
                self._route()
            except (ConnectionError, TimeoutError):
                self.close_connection = True
            except Exception as exc:  # a bug: one log line and a 500, never a dropped connection
                log.error("viewer: %s on %r: %s", type(exc).__name__, self.path[:200], one_line(exc))
                self._send(500, b"internal error", "text/plain; charset=utf-8")

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
            pass

    server_class = type("ViewerServer", (_QuietServer,), {"address_family": address_family(host)})
    try:
        server = server_class((host, port), Handler)
    except OSError as exc:
        raise _bind_error(exc, host, port) from None
    server.host_allowed = host_guard(host, server.server_address[0])
    return server

