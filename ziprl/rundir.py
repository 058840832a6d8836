"""Run directories: one run per ``out_dir``, continued only with ``--resume``, replaced only with ``--overwrite``.

:func:`plan_run_dir` checks what the command asks of ``out_dir`` and touches nothing; :func:`apply_run_dir`
then deletes, creates and marks it. Call the plan before any model loads and the apply only once every other
input has been checked, so bad input never costs an earlier run.

A fresh run writes a marker file, :data:`MARKER` (JSON: format version, creation time, command), atomically.
``--overwrite`` deletes only a directory that carries the marker, only entry by entry, and only when every
entry is one a run writes (:data:`RUN_FILES`, :data:`RUN_DIRS`, dated configs): anything else, a symbolic link
anywhere in the tree (runs never create one), or a missing marker (a directory of an older ZipRL included:
delete it yourself) is refused, naming the offending entries, with nothing touched. ``--out`` itself may be a
symbolic link: it is resolved, the checks and the protections (working, home and root directories) apply to
its target, and the link is kept. HF's Trainer deletes only its own ``checkpoint-<n>`` directories (its
``overwrite_output_dir`` never deleted anything) and Lightning only warns about a non-empty checkpoint
directory; ZipRL does delete, so that an old run's checkpoints and metrics never mix with a new one's, but
only what its own marked run wrote.

``--resume`` checks that the checkpoint ``latest`` names is complete (``state.json`` readable) so a broken
one fails in a second, not after minutes of model loading; it also resumes a run made before the marker
existed, and marks it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ziprl.config import ConfigError
from ziprl.paths import atomic_write_json

MARKER = ".ziprl-run"
MARKER_FORMAT = 1
RUN_FILES = (MARKER, "config.json", "metrics.jsonl")  # top-level files a run writes
RUN_DIRS = ("checkpoints", "tb", "trajectories")  # top-level directories a run writes
_RUN_NAME_RE = re.compile(r"^(config\.\d{8}-\d{6}\.json|\.\.ziprl-run\.[0-9a-f]{8}\.tmp)$")  # dated configs, marker temps
SHOWN = 5  # offending entries named in an error


class RunDirError(ConfigError):
    """The run directory cannot be used as asked; the message says why and what to pass instead."""


@dataclass(frozen=True)
class RunDirPlan:
    """What :func:`apply_run_dir` does: empty ``out`` of ``delete`` (a marked run's entries), create and mark it."""

    out: Path
    delete: tuple[Path, ...] = ()
    resume_from: Path | None = None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > SHOWN else "")


def is_run_entry(name: str) -> bool:
    """Whether a top-level entry of that name is one a ZipRL run writes into its ``out_dir``."""
    return name in RUN_FILES or name in RUN_DIRS or _RUN_NAME_RE.match(name) is not None


def read_marker(out: Path) -> dict[str, Any] | None:
    """The run marker in ``out`` (a regular file holding a JSON object with ``format``), or None."""
    path = out / MARKER
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and "format" in data else None


def symlinks_in(root: Path) -> list[str]:
    """Paths (relative to ``root``) of the symbolic links anywhere under ``root``, never following one."""
    found = []
    for top, dirs, files in os.walk(root):  # os.walk lists a link to a directory in dirs and does not enter it
        found += [os.path.relpath(os.path.join(top, n), root) for n in sorted(dirs + files)
                  if os.path.islink(os.path.join(top, n))]
    return found


def _guard_delete(out: Path) -> None:
    """Refuse to delete a directory that holds the working directory or the home directory."""
    resolved, protected = out.resolve(), [Path.cwd().resolve(), Path.home().resolve(), Path("/")]
    if any(resolved == p or resolved in p.parents for p in protected):
        raise RunDirError(f"--overwrite would delete {resolved}, which holds the working or home directory; "
                          "choose a dedicated --out directory for the run")


def _plan_overwrite(out: Path) -> tuple[Path, ...]:
    """The entries ``--overwrite`` deletes from the used directory ``out``; RunDirError (nothing touched) if any
    is not a marked run's."""
    _guard_delete(out)
    target = out.resolve()
    names = sorted(p.name for p in target.iterdir())
    fix = "nothing was deleted"
    if read_marker(target) is None:
        raise RunDirError(f"--overwrite: {out} has no {MARKER} marker, so it is not known to be a ZipRL run "
                          f"({_shown(names)}); {fix}. If it is a run of an older ZipRL, check it and delete it "
                          "yourself (or continue it with --resume); otherwise choose another --out")
    foreign = [n for n in names if not is_run_entry(n)]
    if foreign:
        raise RunDirError(f"--overwrite: {out} holds entries a ZipRL run does not write ({_shown(foreign)}); "
                          f"{fix}: move them out of the run directory, or choose another --out")
    links = symlinks_in(target)
    if links:
        raise RunDirError(f"--overwrite: {out} holds symbolic links ({_shown(links)}), which a ZipRL run never "
                          f"creates; {fix}: remove the links yourself (their targets are not part of the run), "
                          "or choose another --out")
    return tuple(target / n for n in names)


def _plan_resume(out: Path, used: bool) -> Path:
    """The verified checkpoint ``--resume`` continues from; RunDirError if there is none."""
    from ziprl.learner.checkpoint import latest_checkpoint, verify_checkpoint

    if not used:
        raise RunDirError(f"--resume: {out} holds no run to resume; drop --resume to start a new run there")
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


def plan_run_dir(out_dir: str | Path, resume: bool, overwrite: bool) -> RunDirPlan:
    """Check what a run may do with ``out_dir``, touching nothing; RunDirError says what to pass instead.

    - empty or missing: a fresh run (``--resume`` then fails: there is nothing to resume);
    - non-empty: ``--resume`` continues from the checkpoint ``latest`` names (verified), ``--overwrite``
      replaces a marked run (see the module doc); with neither, RunDirError.
    """
    out = Path(out_dir)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite contradict each other: pass one (continue, or replace the run)")
    if out.is_symlink() and not out.exists():
        raise RunDirError(f"run directory {out} is a symbolic link to nothing; remove the link or choose another --out")
    if out.exists() and not out.is_dir():
        raise RunDirError(f"run directory {out} exists and is not a directory; choose another --out")
    used = out.is_dir() and any(p.name != MARKER for p in out.iterdir())  # a bare marker: a run that wrote nothing
    if resume:
        return RunDirPlan(out, resume_from=_plan_resume(out, used))
    if used and not overwrite:
        names = sorted(p.name for p in out.iterdir())
        raise RunDirError(f"run directory {out} is not empty ({_shown(names)}); pass --resume to continue that run, "
                          "--overwrite to replace it, or choose another --out")
    return RunDirPlan(out, delete=_plan_overwrite(out) if used else ())


def apply_run_dir(plan: RunDirPlan, command: str | None = None) -> Path | None:
    """Carry out ``plan``: delete its entries, clean killed checkpoint writes, create ``out`` and mark it.

    Returns the checkpoint to resume from (None for a fresh run). ``command`` goes into the marker
    (default: this process's arguments).
    """
    from ziprl.learner.checkpoint import clean_orphans

    for entry in plan.delete:  # rmtree refuses a symbolic link and never follows one inside
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if plan.resume_from is not None:
        clean_orphans(plan.out)
    plan.out.mkdir(parents=True, exist_ok=True)
    if plan.resume_from is None or read_marker(plan.out) is None:  # a resumed run keeps its marker
        write_marker(plan.out, command)
    return plan.resume_from


def prepare_run_dir(out_dir: str | Path, resume: bool, overwrite: bool, command: str | None = None) -> Path | None:
    """:func:`plan_run_dir` then :func:`apply_run_dir`: for callers with no other input left to check."""
    return apply_run_dir(plan_run_dir(out_dir, resume, overwrite), command)


def write_marker(out_dir: str | Path, command: str | None = None) -> Path:
    """Mark ``out_dir`` as a ZipRL run (atomically); returns the marker's path."""
    command = command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    return atomic_write_json(Path(out_dir) / MARKER, {"format": MARKER_FORMAT, "created": time.strftime(
        "%Y-%m-%dT%H:%M:%S%z"), "command": command})


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
