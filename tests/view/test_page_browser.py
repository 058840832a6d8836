"""The viewer in a real browser: headless Chromium (Debian's package) loads the page and we read back its DOM.

Skipped, with the reason, only when no Chromium is installed (`.ci/run` installs it: apt-get install chromium).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading

import pytest

from ziprl.testing.viewer_data import write_many, write_run
from ziprl.view.command import main
from ziprl.view.data import load_run
from ziprl.view.server import make_server

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium found: apt-get install chromium")


def browse(url: str, tmp_path, screenshot: str | None = None) -> str:
    """The DOM after the page's scripts ran (and fetched), as Chromium serialises it."""
    out = ["--screenshot=" + screenshot, "--window-size=1280,900", "--hide-scrollbars"] if screenshot else ["--dump-dom"]
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000", *out, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def assert_no_injection(dom: str) -> None:
    assert 'data-ready="1"' in dom  # the viewer's own script ran ...
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]  # ... no injected one did
    assert not re.search(r"<img[^>]*src=\"?x", dom)
    assert "<svg onload" not in dom
    assert not re.search(r'<a[^>]*href="javascript:', dom)
    assert "<title>ZipRL trajectories: run</title>" in dom


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("view")
    assert main([str(write_run(tmp / "run", n=12, steps=3)), "--out", str(tmp / "report.html"), "--tokenizer", "none"]) == 0
    return tmp / "report.html"


def test_list_episode_and_side_by_side_render_and_injected_script_does_not_run(report, tmp_path):
    url = report.as_uri()
    dom = browse(url, tmp_path)
    assert_no_injection(dom)
    assert "page 1 of 2 · 60 of 60 episodes" in dom
    assert len(re.findall(r'<tr data-id="\d+">', dom)) == 50
    assert "&lt;/script&gt;&lt;script&gt;document.body.setAttribute" in dom  # the adversarial question, as text

    dom = browse(url + "#/ep/0", tmp_path)
    assert_no_injection(dom)
    episode = dom.split('<section id="view-episode" class="view">', 1)[1].split("</section>", 1)[0]
    assert len(re.findall(r'<div class="turn[^"]*" id="turn-\d+"', episode)) == 3
    assert '<div class="format-error">Format error: no action' in episode
    assert '<span class="badge answer">answer</span>' in episode
    assert "&lt;img src=x onerror=" in episode  # the adversarial note, as text
    assert 'href="#/cmp/0/48"' in episode  # the same question in eval react

    dom = browse(url + "#/cmp/36/48", tmp_path)
    assert_no_injection(dom)
    compare = dom.split('<section id="view-compare" class="view">', 1)[1].split("</section>", 1)[0]
    assert re.findall(r'<dd class="strategy">(\w+)</dd>', compare) == ["adaptive", "react"]
    assert len(re.findall(r'id="turn-\d+"', compare)) == 3 + 5

    shot = tmp_path / "episode.png"
    browse(url + "#/ep/7", tmp_path, screenshot=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_served_run_of_10000_episodes(tmp_path):
    server = make_server(load_run(write_many(tmp_path / "big.parquet", 10_000)), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        dom = browse(base + "#/ep/9999", tmp_path)  # the episode comes from /api/episode/9999
        assert "page 1 of 200 · 10000 of 10000 episodes" in dom
        assert '<div class="episode" data-id="9999">' in dom
        assert re.search(r'<div class="turn[^"]*" id="turn-1"', dom)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
