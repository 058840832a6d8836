"""Render the viewer page with Jinja2 (autoescaped): the run's charts, the episode index and the client script.

Data reaches the browser only as JSON inside ``<script type="application/json">`` (made inert by
:func:`script_json`) and is put on the page by the client script as text nodes, never parsed as HTML.
A Content-Security-Policy allows only the page's own script and style (by hash), so even markup that
slipped through could not run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from ziprl.view.charts import level_bars, line_chart
from ziprl.view.data import Run, build_index, episode, step_stats

HERE = Path(__file__).parent
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def json_safe(obj: Any) -> Any:
    """``obj`` as JSON values, recursively: NaN and infinities as None (JSON has neither), bytes as hex, anything
    else JSON lacks (dates, decimals from odd Parquet columns) as its text."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, bytes):
        return obj.hex()
    if obj is None or isinstance(obj, str | int):
        return obj
    return str(obj)


def script_json(obj: Any) -> Markup:
    """JSON that is safe inside a <script> element: no '<', '>', '&' (so no '</script>') and no U+2028/2029."""
    text = json.dumps(json_safe(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return Markup("".join(_JSON_ESCAPES.get(c, c) for c in text))


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["script_json"] = script_json
    return env


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def assets() -> tuple[str, str]:
    """The client script and style sheet, inlined into every page."""
    return (HERE / "static" / "viewer.js").read_text(), (HERE / "static" / "viewer.css").read_text()


def content_security_policy(js: str, css: str, served: bool) -> str:
    """Only the page's own inline script and style run; a served page may also fetch from its own server."""
    connect = "'self'" if served else "'none'"
    return (f"default-src 'none'; script-src {_sha256(js)}; style-src {_sha256(css)}; connect-src {connect}; "
            "img-src 'none'; base-uri 'none'; form-action 'none'")


def render_page(run: Run, static: bool) -> str:
    """The whole page: static pages embed every episode; served pages fetch episodes from /api/episode/<id>."""
    js, css = assets()
    stats = json_safe(step_stats(run))
    episodes = {str(i): episode(run, i) for i in range(run.num_episodes)} if static else None
    return _env().get_template("page.html.j2").render(
        title=f"ZipRL trajectories: {run.name}", run_name=run.name, index=build_index(run), episodes=episodes,
        stats=stats, line=line_chart(stats), bars=level_bars(stats), js=Markup(js), css=Markup(css),
        csp=content_security_policy(js, css, served=not static), tokenizer=run.decode is not None,
    )
