"""Run directories (kind ``run`` of the output rule, :mod:`ziprl.outputs`, and ``sft``, which checkpoints the same
way): one run per ``out_dir``, continued only with ``--resume``, replaced only with ``--overwrite``.

:func:`plan_run_dir` checks what the command asks of ``out_dir`` and touches nothing; :func:`claim_run_dir` then
locks it, checks it again under the lock, deletes, creates and marks it, and holds the lock while its block runs
(the command's whole life), so a second process started on the same ``out_dir`` is refused with the first one's
PID. Call the plan before any model loads and the claim only once every other input has been checked, so bad
input never costs an earlier run. ``out_dir`` is normalised first (``nosuch/../run`` is ``run``); the command
writes to the plan's ``out``.

A fresh run writes the marker (:data:`ziprl.outputs.MARKER`, kind ``run``) atomically. ``--overwrite`` deletes
only a directory that carries the marker, only entry by entry, and only when every entry is one a run writes
(:data:`RUN_FILES`, :data:`RUN_DIRS`, dated configs): anything else, a symbolic or hard link anywhere in the tree
(runs never create one), or a missing marker (a directory of an older ZipRL included: delete it yourself) is
refused, naming the offending entries, with nothing touched. ``--out`` itself may be a symbolic link: it is
resolved, the checks and the protections (working, home and root directories) apply to its target, and the link
is kept. HF's Trainer deletes only its own ``checkpoint-<n>`` directories (its ``overwrite_output_dir`` never
deleted anything) and Lightning only warns about a non-empty checkpoint directory; ZipRL does delete, so that an
old run's checkpoints and metrics never mix with a new one's, but only what its own marked run wrote.

``--resume`` refuses a run holding a link (it would write through it), and checks that the checkpoint ``latest``
names is complete (``state.json`` readable) so a broken one fails in a second, not after minutes of model
loading; it also resumes a run made before the marker existed, and marks it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ziprl.outputs import (
    LOCK,
    MARKER,
    OutputError,
    checked_dir,
    delete,
    entries,
    locked,
    plan_dir,
    read_marker,
    refuse_links,
    write_marker,
)
from ziprl.paths import atomic_write_text

RUN_FILES = (MARKER, LOCK, "config.json", "metrics.jsonl")  # top-level files a run writes
RUN_DIRS = ("checkpoints", "tb", "trajectories")  # top-level directories a run writes
is_run_entry = entries(*map(re.escape, RUN_FILES[2:] + RUN_DIRS), r"config\.\d{8}-\d{6}\.json")  # and dated configs


@dataclass(frozen=True)
class RunDirPlan:
    """What :func:`apply_run_dir` does: empty ``out`` of ``delete`` (a marked run's entries), create and mark it
    ``kind`` (whose top-level entries ``owns`` tells)."""

    out: Path
    overwrite: bool = False
    delete: tuple[Path, ...] = ()
    resume_from: Path | None = None
    kind: str = "run"
    owns: Callable[[str], bool] = is_run_entry


def _plan_resume(out: Path, used: bool) -> Path:
    """The verified checkpoint ``--resume`` continues from; OutputError if there is none or the run holds a link."""
    from ziprl.learner.checkpoint import latest_checkpoint, verify_checkpoint

    if not used:
        raise OutputError(f"--resume: {out} holds no run to resume; drop --resume to start a new run there")
    refuse_links(out, flag="--resume: ")
    try:
        ckpt = latest_checkpoint(out)
    except (FileNotFoundError, ValueError) as exc:
        raise OutputError(f"--resume: {exc}; pass --overwrite to start over") from None
    if ckpt is None:
        raise OutputError(f"--resume: {out} has no checkpoint to resume from (no checkpoints/latest); "
                          "pass --overwrite to start over, or choose another --out")
    try:
        verify_checkpoint(ckpt)
    except ValueError as exc:
        raise OutputError(f"--resume: {exc}; pass --overwrite to start over") from None
    return ckpt


def plan_run_dir(out_dir: str | Path, resume: bool, overwrite: bool, kind: str = "run",
                 owns: Callable[[str], bool] = is_run_entry) -> RunDirPlan:
    """Check what a run of ``kind`` (writing the entries ``owns`` tells) may do with ``out_dir``, touching nothing;
    OutputError says what to pass instead.

    - missing, empty or holding only a bare marker: a fresh run (``--resume`` then fails: there is nothing to resume);
    - in use: ``--resume`` continues from the checkpoint ``latest`` names (verified), ``--overwrite`` replaces a
      marked run (see the module doc); with neither, OutputError.
    """
    if resume and overwrite:
        raise OutputError("--resume and --overwrite contradict each other: pass one (continue, or replace the run)")
    if resume:
        out, used = checked_dir(out_dir, kind)
        return RunDirPlan(out, resume_from=_plan_resume(out, used), kind=kind, owns=owns)
    plan = plan_dir(out_dir, kind, overwrite, owns,
                    fix="pass --resume to continue that run, --overwrite to replace it, or choose another --out")
    return RunDirPlan(plan.out, overwrite, plan.delete, kind=kind, owns=owns)


def apply_run_dir(plan: RunDirPlan, command: str | None = None) -> Path | None:
    """Carry out ``plan``: delete its entries, clean killed checkpoint writes, create ``out`` and mark it.

    Returns the checkpoint to resume from (None for a fresh run). ``command`` goes into the marker
    (default: this process's arguments).
    """
    from ziprl.learner.checkpoint import clean_orphans

    delete(plan.delete)
    if plan.resume_from is not None:
        clean_orphans(plan.out)
    plan.out.mkdir(parents=True, exist_ok=True)
    if plan.resume_from is None or read_marker(plan.out) is None:  # a resumed run keeps its marker
        write_marker(plan.out, plan.kind, command)
    return plan.resume_from


@contextmanager
def claim_run_dir(plan: RunDirPlan, command: str | None = None) -> Iterator[Path | None]:
    """Lock ``plan.out`` while the block runs, plan again under the lock and apply that plan; yields the checkpoint
    to resume from (None for a fresh run)."""
    with locked(plan.out):
        yield apply_run_dir(plan_run_dir(plan.out, plan.resume_from is not None, plan.overwrite, plan.kind, plan.owns),
                            command)


def prepare_run_dir(out_dir: str | Path, resume: bool, overwrite: bool, command: str | None = None) -> Path | None:
    """:func:`plan_run_dir` then :func:`apply_run_dir`, with no lock held after: for scripts that write the run in
    this process right after, with no other input left to check."""
    return apply_run_dir(plan_run_dir(out_dir, resume, overwrite), command)


def write_config(out_dir: str | Path, config: dict[str, Any]) -> Path:
    """Write ``config.json`` atomically; a resumed run with the same config leaves it as it is, one with a different
    config keeps it and adds a dated one."""
    out = Path(out_dir)
    text = json.dumps(config, indent=2) + "\n"
    path = out / "config.json"
    if path.is_file():
        if path.read_text(encoding="utf-8", errors="replace") == text:
            return path
        path = out / f"config.{time.strftime('%Y%m%d-%H%M%S')}.json"
        print(f"[run] the configuration differs from {out / 'config.json'}; this run's is in {path}", flush=True)
    return atomic_write_text(path, text)
