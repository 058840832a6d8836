"""The viewer's page: the embedded JSON is inert inside its script tag, and the static page escapes everything
a run holds."""

from __future__ import annotations

import base64
import hashlib
import html as html_lib
import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ziprl.env.protocol import unescape
from ziprl.testing.viewer_data import EVIL, write_run
from ziprl.view.data import load_run
from ziprl.view.page import render_page, script_json


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4), max_leaves=12))
def test_script_json_is_inert_inside_a_script_tag(obj):
    text = str(script_json(obj))
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(text) == obj


def test_static_page_escapes_everything(tmp_path):
    run_dir = write_run(tmp_path / "<i>run&", n=3, steps=1)
    html = render_page(load_run(run_dir), static=True)
    assert html.count("<script") == 3  # the index, the episodes, the viewer code; no injected one
    assert "<img" not in html
    assert "<svg onload" not in html
    assert 'href="javascript:' not in html
    assert "<title>ZipRL trajectories: &lt;i&gt;run&amp;</title>" in html
    assert "\u2028" not in html
    assert "\u2029" not in html
    assert "http://" not in html
    assert "https://" not in html  # works offline: nothing external
    csp = html_lib.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1))
    code = re.search(r"<script>(.*?)</script>", html, re.DOTALL).group(1)
    digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}';" in csp
    assert "connect-src 'none'" in csp
    episodes = json.loads(re.search(r'<script type="application/json" id="ziprl-episodes">(.*?)</script>', html,
                                    re.DOTALL).group(1))
    assert episodes["0"]["question"] == EVIL
    assert episodes["0"]["turns"][0]["note"] == unescape(EVIL)  # as the env reads notes
