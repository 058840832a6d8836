"""Serve the viewer on a local port: the page at ``/``, one episode as JSON at ``/api/episode/<id>``."""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ziprl.view.data import Run, episode
from ziprl.view.page import assets, content_security_policy, finite, render_page

_EPISODE_RE = re.compile(r"/api/episode/(\d+)")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def make_server(run: Run, host: str = "127.0.0.1", port: int = 8265) -> ThreadingHTTPServer:
    """A threaded HTTP server over ``run`` (call ``serve_forever``; ``server_address`` has the bound port)."""
    page = render_page(run, static=False).encode()
    csp = content_security_policy(*assets(), served=True)

    class Handler(BaseHTTPRequestHandler):
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

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            host_header = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
            if host in LOCAL_HOSTS and host_header not in LOCAL_HOSTS:  # DNS-rebinding guard
                self._send(403, b"forbidden host", "text/plain; charset=utf-8")
                return
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(200, page, "text/html; charset=utf-8")
            elif m := _EPISODE_RE.fullmatch(path):
                try:
                    body = json.dumps(finite(episode(run, int(m.group(1)))), allow_nan=False).encode()
                except KeyError as exc:
                    self._send(404, json.dumps({"error": str(exc)}).encode(), "application/json")
                    return
                self._send(200, body, "application/json")
            else:
                self._send(404, b"not found", "text/plain; charset=utf-8")

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
            pass

    return ThreadingHTTPServer((host, port), Handler)
