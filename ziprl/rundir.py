"""Run directories: one run per ``out_dir``, continued only with ``--resume``, replaced only with ``--overwrite``.

Call :func:`prepare_run_dir` before any model loads: it refuses a non-empty ``out_dir`` unless told what to do
with it, cleans the temporary directories of killed checkpoint writes, and, for ``--resume``, checks the
checkpoint ``latest`` names (files complete, ``state.json`` readable) so a broken one fails in a second, not
after minutes of model loading.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from ziprl.config import ConfigError


class RunDirError(ConfigError):
    """The run directory cannot be used as asked; the message says why and what to pass instead."""


def _guard_delete(out: Path) -> None:
    """Refuse to delete a directory that holds the working directory or the home directory."""
    resolved, protected = out.resolve(), [Path.cwd().resolve(), Path.home().resolve(), Path("/")]
    if any(resolved == p or resolved in p.parents for p in protected):
        raise RunDirError(f"--overwrite would delete {resolved}, which holds the working or home directory; "
                          "choose a dedicated --out directory for the run")


def prepare_run_dir(out_dir: str | Path, resume: bool, overwrite: bool) -> Path | None:
    """Make ``out_dir`` ready for a run; returns the checkpoint to resume from (None for a fresh run).

    - empty or missing: a fresh run (``--resume`` then fails: there is nothing to resume);
    - non-empty: ``--resume`` continues from the checkpoint ``latest`` names (verified), ``--overwrite``
      deletes the old run first; with neither, RunDirError.
    """
    from ziprl.learner.checkpoint import clean_orphans, latest_checkpoint, verify_checkpoint

    out = Path(out_dir)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite contradict each other: pass one (continue, or replace the run)")
    if out.exists() and not out.is_dir():
        raise RunDirError(f"run directory {out} exists and is not a directory; choose another --out")
    used = out.is_dir() and any(out.iterdir())
    if resume:
        if not used:
            raise RunDirError(f"--resume: {out} holds no run to resume; drop --resume to start a new run there")
        clean_orphans(out)
        try:
            ckpt = latest_checkpoint(out)
        except (FileNotFoundError, ValueError) as exc:
            raise RunDirError(f"--resume: {exc}; pass --overwrite to start over") from None
        if ckpt is None:
            raise RunDirError(f"--resume: {out} has no checkpoint to resume from (no checkpoints/latest); "
                              "pass --overwrite to start over, or choose another --out")
        try:
            verify_checkpoint(ckpt)
        except ValueError as exc:
            raise RunDirError(f"--resume: {exc}; pass --overwrite to start over") from None
        return ckpt
    if used and not overwrite:
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise RunDirError(f"run directory {out} is not empty ({shown}); pass --resume to continue that run, "
                          "--overwrite to replace it, or choose another --out")
    if used:
        _guard_delete(out)
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return None


def write_config(out_dir: str | Path, config: dict[str, Any]) -> Path:
    """Write ``config.json``; a resumed run with a different config keeps the old file and adds a dated one."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config, indent=2) + "\n"
    path = out / "config.json"
    if path.is_file() and path.read_text(encoding="utf-8", errors="replace") != text:
        path = out / f"config.{time.strftime('%Y%m%d-%H%M%S')}.json"
        print(f"[run] the configuration differs from {out / 'config.json'}; this run's is in {path}", flush=True)
    path.write_text(text, encoding="utf-8")
    return path
