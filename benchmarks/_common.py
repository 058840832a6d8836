"""Shared by the benchmark scripts: write results as JSON and a markdown table under benchmarks/results/, each file
headed by where the result comes from (:func:`provenance`)."""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from ziprl.boundary import not_utf8, printable
from ziprl.cli.common import at_least, listed, one_of  # noqa: F401  (the benchmarks' argument types)
from ziprl.outputs import OutputError, locked, work_dir
from ziprl.paths import LEFTOVER, atomic_write_text
from ziprl.policy.cpu.isa import cpu_flags

if not_utf8(sys.argv[1:]):  # every benchmark imports this first: refused before any work, as ZipRL's commands are
    print(f"error: {not_utf8(sys.argv[1:])}", file=sys.stderr)
    raise SystemExit(2)

SCRIPTS = Path(__file__).resolve().parent  # the benchmark scripts: <stem>.py
RESULTS = SCRIPTS / "results"
NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")  # a results name: files in RESULTS, never a path
REPO = RESULTS.parents[1]
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")  # the ones kernels choose by


def _run(cmd: list[str]) -> str | None:
    """``cmd``'s stripped stdout, None when it cannot run or fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> str:
    """``git rev-parse HEAD``, with ``-dirty`` when tracked files outside benchmarks/results differ from it (results
    are this code's output, not its input); ``unknown`` outside a git checkout."""
    head = _run(["git", "rev-parse", "HEAD"])
    if head is None:
        return "unknown"
    changed = _run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                    ":(exclude)benchmarks/results"])
    return head + ("-dirty" if changed else "")


COMMIT = git_commit()  # at import: the code a benchmark started with, whatever is committed while it runs


def cpuinfo() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (empty where there is none)."""
    path, fields = Path("/proc/cpuinfo"), {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def machine() -> dict[str, str | int | list[str] | None]:
    """CPU model, cores, the CPU flags that choose kernels (as capped by ``ONEDNN_MAX_CPU_ISA``, recorded beside them),
    torch version and GPU (None without one)."""
    cpu, flags = cpuinfo(), cpu_flags()
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    gpu = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) if shutil.which("nvidia-smi") else None
    return {"cpu": cpu.get("model name") or platform.processor() or platform.machine(), "cores": os.cpu_count() or 0,
            "cpu_flags": [f for f in CPU_FLAGS if f in flags], "max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or None,
            "python": platform.python_version(), "torch": torch,
            "gpu": "; ".join(gpu.splitlines()) if gpu else None}


def command_line() -> str:
    """How this process was started (``bash`` for a shell script's, which names itself in ``sys.argv[0]``), paths as
    :func:`portable` writes them, bytes that are not UTF-8 escaped."""
    shell = "bash" if sys.argv[0].endswith(".sh") else "python"
    return shlex.join([shell, *[printable(portable(a) if a.startswith(("/", "~")) else a) for a in sys.argv]])


def provenance(config: str | Path | dict | None = None) -> dict:
    """Where a result comes from: commit, command line, config (a path: where it is and what it says; a dict: as
    given), machine and date (UTC)."""
    if isinstance(config, str | Path):
        path = Path(config)
        config = {"path": portable(path), "text": path.read_text() if path.is_file() else None}
    return {"commit": COMMIT, "command": command_line(), "config": config, "machine": machine(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def markdown_header(prov: dict) -> list[str]:
    """The lines a results markdown file starts with: :func:`provenance` for a reader."""
    m, config = prov["machine"], prov["config"]
    where = config.get("path", "given in the JSON") if isinstance(config, dict) else "none"
    flags = (", ".join(m["cpu_flags"]) or "none of " + "/".join(CPU_FLAGS)) + (
        f"; capped by ONEDNN_MAX_CPU_ISA={m['max_cpu_isa']}" if m.get("max_cpu_isa") else "")
    return [f"- commit: `{prov['commit']}`", f"- command: `{prov['command']}`", f"- config: `{where}`",
            f"- machine: {m['cpu']}, {m['cores']} cores ({flags}); torch {m['torch']}; GPU {m['gpu'] or 'none'}",
            f"- date: {prov['date']}", ""]


def portable(path: str | Path | None) -> str | None:
    """``path`` as results may record it: relative to the repository, or under ``<ZIPRL_CACHE>``, never this
    machine's absolute path."""
    from ziprl.paths import cache_root

    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    for root, label in ((REPO, "."), (cache_root().resolve(), "<ZIPRL_CACHE>")):
        if p.is_relative_to(root):
            return str(Path(label) / p.relative_to(root))
    return p.name


def in_work_dir(path: str | Path, body: Callable[[Path], None], what: str = "",
                check: Callable[[Path], None] | None = None, kind: str = "bench") -> int:
    """``body(out)`` in the benchmark working directory ``path`` (new, empty or one marked with ``kind``: "bench" for
    learning.py's, which learning_compare.py shares; held while ``body`` runs, so a second benchmark there is refused
    naming the first); 2, with one ``error:`` line starting with ``what``, when it cannot be used or ``check(out)``
    (before anything is written there) refuses it."""
    try:
        out = work_dir(path, kind)
        if check is not None:
            check(out)
        with locked(out):
            body(out)
    except OutputError as exc:
        print(f"error: {what}{exc}", file=sys.stderr)
        return 2
    return 0


def model_dir(text: str) -> Path:
    """An argparse ``type``: a model directory (``config.json`` and safetensors weights), made absolute (a benchmark's
    runs may start elsewhere)."""
    from ziprl.policy.models import ModelPathError, validate_model_dir

    path = Path(os.path.realpath(Path(text).expanduser()))
    if not text.strip() or not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text[:200]!r} is not a directory; pass a model directory (config.json and "
                                         "*.safetensors, e.g. <ZIPRL_CACHE>/stage1/<key>/model)")
    try:
        return validate_model_dir(path)
    except ModelPathError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def results_name(name: str) -> str:
    """An argparse ``type`` for a results name: checked when the arguments are parsed, before any work starts; a
    path, or results another script wrote (:func:`results_writer`), is refused."""
    if not NAME_RE.fullmatch(name):
        raise argparse.ArgumentTypeError(f"{name[:80]!r}: use letters, digits, '_', '-' or '.' (not first); "
                                         f"it names files in {RESULTS}")
    writer, script = results_writer(name), Path(sys.argv[0]).name
    if writer not in (None, script):
        what = f"hold the results of {writer}, not of {script}" if writer else "hold files no benchmark wrote"
        raise argparse.ArgumentTypeError(f"{name!r}: {RESULTS / name}.json and .md {what}; nothing was written: "
                                         "choose another name, or delete those files yourself to replace them")
    return name


def results_names(*suffixes: str) -> Callable[[str], str]:
    """An argparse ``type`` for a script that writes ``<name><suffix>`` for each of ``suffixes`` (``""``: ``<name>``
    itself): :func:`results_name` of every one, so a name whose derived results another script wrote is refused
    before any work, not after the first file was written."""
    def check(name: str) -> str:
        for suffix in suffixes or ("",):
            results_name(name + suffix)
        return name
    return check


def png_writer(path: Path) -> str | None:
    """The script a plot's PNG names as its writer (``ziprl.plots.save_figure`` tags it), or None (untagged, or not
    a PNG)."""
    from PIL import Image

    from ziprl.plots import SOFTWARE

    try:
        with Image.open(path) as image:
            tag = getattr(image, "text", {}).get("Software", "")
    except (OSError, ValueError, SyntaxError):
        return None
    return tag.removeprefix(f"{SOFTWARE} ") if tag.startswith(f"{SOFTWARE} ") else None


def check_plots(name: str, suffixes: tuple[str, ...] = ("",)) -> str:
    """``name``, once the plots this script writes for it (``<name><suffix>.png`` in RESULTS) are new or its own:
    tagged by it, or, untagged (written before the tag), beside results it may replace (``<name>[_part].json`` it
    wrote, or older than the provenance and named after it: :func:`results_writer`); ArgumentTypeError otherwise
    (checked before any work, as :func:`results_name` is)."""
    script, beside_own = Path(sys.argv[0]).name, None
    for suffix in suffixes:
        png = RESULTS / f"{name}{suffix}.png"
        if not os.path.lexists(png):
            continue
        writer = png_writer(png)
        if writer is None and beside_own is None:  # results of the name this script may replace (once for all plots)
            parts = [p for p in (RESULTS / f"{name}.json", *RESULTS.glob(f"{glob.escape(name)}_*.json")) if p.is_file()]
            beside_own = any(results_writer(p.stem) == script for p in parts)
        if writer == script or (writer is None and beside_own):
            continue  # its own, or beside results it may replace (its own, or older ones named after it)
        what = f"is a plot of {writer}" if writer else "is not a plot this script wrote"
        raise argparse.ArgumentTypeError(f"{name!r}: {png} {what}; nothing was written: choose another name, or "
                                         "delete it yourself to replace it")
    return name


def plots_name(*suffixes: str) -> Callable[[str], str]:
    """An argparse ``type``: :func:`results_name`, whose plots (``<name><suffix>.png``; default ``<name>.png``) are
    checked too (:func:`check_plots`)."""
    return lambda name: check_plots(results_name(name), suffixes or ("",))


def legacy_writer(name: str) -> str:
    """The script that wrote results ``<name>`` older than the provenance (rows, no command): the one they are named
    after, ``<S>.py`` in :data:`SCRIPTS` with the longest stem ``S`` such that ``name`` is ``S`` or starts with
    ``S_`` (``cpu_engines_fused_chat``: cpu_engines.py; ``learning_compare_diff``: learning_compare.py, not
    learning.py); ``""`` when none is."""
    stems = [p.stem for p in SCRIPTS.glob("*.py") if not p.stem.startswith("_")]
    named = [s for s in stems if name == s or name.startswith(f"{s}_")]
    return f"{max(named, key=len)}.py" if named else ""


def results_writer(name: str) -> str | None:
    """The script that wrote the results ``<name>`` (the file name in their provenance's command; for results older
    than the provenance, no command, the script they are named after: :func:`legacy_writer`); None when there are
    none yet; ``""`` for files :func:`write_results` did not write (a .json that is not its, a .md without a .json,
    older results named after no script)."""
    js, md = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    if not os.path.lexists(js):
        return "" if os.path.lexists(md) else None
    try:
        data = json.loads(js.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not isinstance(data, dict) or "rows" not in data:
        return ""
    if "command" not in data:
        return legacy_writer(name)
    try:
        words = shlex.split(data["command"]) if isinstance(data["command"], str) else []
    except ValueError:  # unbalanced quotes
        words = []
    return Path(words[1]).name if len(words) > 1 else ""


def remove_leftovers(name: str) -> None:
    """Remove the temporaries an earlier :func:`write_results` of ``name`` left in RESULTS when it was killed
    between its writes (``.<name>.json.<hex>.tmp``, ``.<name>.md.<hex>.tmp``: :data:`ziprl.paths.LEFTOVER`); plain
    files only, never a link or a directory, nor another name's."""
    own = {f"{name}.json", f"{name}.md"}
    with os.scandir(RESULTS) as entries:
        leftovers = [Path(e.path) for e in entries
                     if (m := LEFTOVER.fullmatch(e.name)) and m[1] in own and e.is_file(follow_symlinks=False)]
    for path in leftovers:
        path.unlink(missing_ok=True)


def write_results(name: str, rows: list[dict], meta: dict | None = None,
                  config: str | Path | dict | None = None) -> tuple[Path, Path]:
    """Write ``results/<name>.json`` (rows, meta and :func:`provenance`) and ``results/<name>.md`` (the provenance,
    then a table of rows); exit 2, nothing written, for a bad name or results another script wrote."""
    try:
        results_name(name)
    except argparse.ArgumentTypeError as exc:
        print(f"error: results name {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    RESULTS.mkdir(parents=True, exist_ok=True)
    remove_leftovers(name)
    prov = provenance(config)
    js = RESULTS / f"{name}.json"
    atomic_write_text(js, json.dumps({"rows": rows, "meta": meta or {}, **prov}, indent=2) + "\n")
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    md = RESULTS / f"{name}.md"
    atomic_write_text(md, "\n".join(markdown_header(prov) + lines) + "\n")
    print("\n".join(lines))
    return js, md
