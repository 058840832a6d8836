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
(:data:`RUN_FILES`, dated configs, and in its directories only what a run writes there:
:mod:`ziprl.learner.run_files`, :data:`TRAJECTORY_ENTRIES`): anything else, a symbolic or hard link anywhere in the tree
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

from ziprl.learner.run_files import CHECKPOINT_ENTRIES, TB_ENTRIES
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
    refuse_held,
    refuse_links,
    sweep_leftovers,
    write_marker,
)
from ziprl.paths import atomic_write_text

RUN_FILES = (MARKER, LOCK, "config.json", "metrics.jsonl")  # top-level files a run writes
# trajectories/: a step's groups, and its dropped ones (ziprl.loop.training)
TRAJECTORY_ENTRIES = r"trajectories(?:/dropped|/(?:dropped/)?step_\d{6,}\.parquet)?"
is_run_entry = entries(*map(re.escape, RUN_FILES[2:]), r"config\.\d{8}-\d{6}\.json",  # and dated configs
                       CHECKPOINT_ENTRIES, TB_ENTRIES, TRAJECTORY_ENTRIES)


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


def _plan_resume(out: Path, used: bool, steps: int | None = None) -> Path:
    """The verified checkpoint ``--resume`` continues from; OutputError if there is none, the run holds a link, or
    the checkpoint is at ``steps`` already (nothing would be trained)."""
    from ziprl.learner.checkpoint import checkpoint_state, latest_checkpoint

    if not used:
        raise OutputError(f"--resume: {out} holds no run to resume; drop --resume to start a new run there")
    refuse_links(out, flag="--resume: ")
    odd = [n for n in ("config.json", "metrics.jsonl") if (out / n).exists() and not (out / n).is_file()]
    if odd:
        raise OutputError(f"--resume: {out / odd[0]} is not a file, as a run writes it; nothing was written: move it "
                          "out of the run directory")
    try:
        ckpt = latest_checkpoint(out)
    except (FileNotFoundError, ValueError) as exc:
        raise OutputError(f"--resume: {exc}; {_recovery(out)}") from None
    if ckpt is None:
        raise OutputError(f"--resume: {out} has no checkpoint to resume from (no checkpoints/latest); {_recovery(out)}")
    try:
        done = checkpoint_state(ckpt)["step"]
    except ValueError as exc:
        raise OutputError(f"--resume: {exc}; {_recovery(out, ckpt.name)}") from None
    if steps is not None and steps <= done:
        raise OutputError(f"--resume: {out} is at step {done} already ({ckpt.name}); pass --steps greater than {done} "
                          "to train further")
    return ckpt


def _recovery(out: Path, broken: str | None = None) -> str:
    """What to do when ``out``'s ``latest`` checkpoint cannot be resumed (``broken``: the one it names): point
    ``latest`` at the newest other complete checkpoint, or, after a finished SFT, use its model; otherwise start
    over."""
    from ziprl.learner.checkpoint import complete_checkpoints

    found = [c for c in complete_checkpoints(out) if c.name != broken]
    if found:
        return (f"an earlier checkpoint is complete: resume from it with `echo {found[-1].name} > "
                f"{out / 'checkpoints' / 'latest'}`, or pass --overwrite to start over")
    if (out / "model" / "config.json").is_file():
        return f"this SFT run finished: its model is {out / 'model'} (pass --overwrite only to train it again)"
    return "pass --overwrite to start over, or choose another --out"


def plan_run_dir(out_dir: str | Path, resume: bool, overwrite: bool, kind: str = "run",
                 owns: Callable[[str], bool] = is_run_entry, steps: int | None = None) -> RunDirPlan:
    """Check what a run of ``kind`` (writing the entries ``owns`` tells) may do with ``out_dir``, touching nothing;
    OutputError says what to pass instead.

    - missing, empty or holding only a bare marker: a fresh run (``--resume`` then fails: there is nothing to resume);
    - in use: ``--resume`` continues from the checkpoint ``latest`` names (verified, and short of ``steps`` when
      given), ``--overwrite`` replaces a marked run (see the module doc); with neither, OutputError.
    """
    if resume and overwrite:
        raise OutputError("--resume and --overwrite contradict each other: pass one (continue, or replace the run)")
    if resume:
        out, used = checked_dir(out_dir, kind)
        refuse_held(out)
        return RunDirPlan(out, resume_from=_plan_resume(out, used, steps), kind=kind, owns=owns)
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
    if plan.out.is_dir():
        sweep_leftovers(plan.out, plan.owns)
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
