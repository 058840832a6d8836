"""Shared by the benchmark scripts: write results as JSON and a markdown table under benchmarks/results/."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from ziprl.paths import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, str | int]:
    import os

    return {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count() or 0, "date": time.strftime("%Y-%m-%d")}


def write_results(name: str, rows: list[dict], meta: dict | None = None) -> tuple[Path, Path]:
    """Write ``results/<name>.json`` (rows + meta + machine) and ``results/<name>.md`` (a table of rows)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    js = RESULTS / f"{name}.json"
    atomic_write_text(js, json.dumps({"rows": rows, "meta": meta or {}, "machine": machine()}, indent=2) + "\n")
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    md = RESULTS / f"{name}.md"
    atomic_write_text(md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return js, md
