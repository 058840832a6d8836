"""The viewer's server: the page, one episode per request, 404 past the last, 403 for a foreign Host (the
DNS-rebinding guard)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from ziprl.testing.viewer_data import EVIL, write_run
from ziprl.view.data import load_run
from ziprl.view.server import make_server


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", n=12, steps=3)


def test_server_serves_page_and_episodes(run_dir):
    server = make_server(load_run(run_dir), port=0)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(base + "/") as r:
            assert r.status == 200
            assert "connect-src 'self'" in r.headers["Content-Security-Policy"]
            assert 'id="ziprl-episodes"' not in r.read().decode()  # episodes are fetched one by one
        with urllib.request.urlopen(base + "/api/episode/0") as r:
            assert r.headers["Content-Type"] == "application/json"
            assert json.load(r)["question"] == EVIL
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(base + "/api/episode/60")
        rebinding = urllib.request.Request(base + "/", headers={"Host": f"attacker.example:{port}"})
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(rebinding)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
