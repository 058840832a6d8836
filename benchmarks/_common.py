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


def portable(path: str | Path | None) -> str | None:
    """``path`` as results may record it: relative to the repository, or under ``<ZIPRL_CACHE>``, never this
    machine's absolute path."""
    from ziprl.paths import cache_root

    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    for root, label in ((RESULTS.parents[1], "."), (cache_root().resolve(), "<ZIPRL_CACHE>")):
        if p.is_relative_to(root):
            return str(Path(label) / p.relative_to(root))
    return p.name


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
