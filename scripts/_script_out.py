"""The output rule of the scripts that write a directory (make_invented.py, make_sample.py, viewer_demo_run.py):
the directory is new, empty, or an earlier output of the same script (its marker, :data:`ziprl.outputs.MARKER`,
names the script); anything else is refused before anything is written. The run holds the directory's lock beside
it (:func:`ziprl.outputs.hold`: a second run there is refused, naming the first), checks it again under the lock,
and builds the output in a temporary directory beside it (so its parent must be writable, checked up front); then
it replaces only the files the script writes, by name (in its subdirectories too), once every one of them was
checked to be a plain file or absent: nothing is deleted, and a refused rerun changes nothing. What a killed run
left beside the directory (its temporary directory) the next run removes, under the lock."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ziprl.outputs import (
    MARKER,
    OutputError,
    checked_dir,
    hold,
    read_marker,
    refuse_links,
    shown,
    sweep_beside,
    write_marker,
)
from ziprl.paths import fsync


def marked_by(out: Path, script: str) -> bool:
    """Whether the marker in ``out`` names ``script`` as the command that wrote it."""
    marker = read_marker(out)
    return marker is not None and Path(str(marker.get("command", "")).split(" ")[0]).name == script


def checked_out(out_dir: str | Path, kind: str, script: str) -> Path:
    """``out_dir`` normalised, once ``script`` may write its output of ``kind`` there: new, empty, or an earlier
    output of ``script`` holding no link; OutputError, nothing written, otherwise."""
    out, used = checked_dir(out_dir, kind)
    if used and not marked_by(out, script):
        names = shown(sorted(p.name for p in out.iterdir()))
        raise OutputError(f"{out} is not empty ({names}) and is not an earlier output of {script} (no {MARKER} marker "
                          f"naming it); nothing was written: choose a new or empty directory")
    if used:
        refuse_links(out)
    if out.is_dir():
        check_parent(out)
    return out


def check_parent(out: Path) -> None:
    """OutputError unless a file can be created in the parent of the existing directory ``out``, on ``out``'s file
    system, where :func:`building` makes its temporary directory (tried: permission bits say nothing for root)."""
    if os.stat(out.parent).st_dev != os.stat(out).st_dev:  # a mount point: the build could not be moved in
        raise OutputError(f"--out {out} is a mount point (its parent {out.parent} is another file system), and the "
                          "output is built beside it and moved in; nothing was written: choose a directory inside it")
    try:
        with tempfile.TemporaryFile(dir=out.parent):
            pass
    except OSError as exc:
        why = exc.strerror or "no permission or a read-only file system"
        raise OutputError(f"--out {out}: the output is built beside it and moved in, but its parent directory "
                          f"{out.parent} cannot be written ({why}); nothing was written: make {out.parent} writable, "
                          "or choose an --out in a directory you can write") from None


def _kind_of(path: Path) -> str | None:
    """What ``path`` is when it is neither absent nor a plain file ("a directory", "a symbolic link", ...)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a symbolic link" if stat.S_ISLNK(mode) else "a special file (not a plain file)"


def _moves(built: Path, out: Path, problems: list[str]) -> list[tuple[Path, Path]]:
    """The (built, target) pairs that put what :func:`building` built into the existing directory ``out``: a new
    entry is moved as it is, a file replaces its plain-file namesake, a directory is merged into its real-directory
    namesake; anything else is named in ``problems`` (and nothing moved)."""
    pairs = []
    for src in sorted(built.iterdir(), key=lambda p: (p.name == MARKER, p.name)):  # the marker last
        dst = out / src.name
        if not os.path.lexists(dst):
            pairs.append((src, dst))
        elif src.is_dir() and not src.is_symlink():
            if dst.is_symlink() or not dst.is_dir():
                problems.append(f"{dst} is {_kind_of(dst) or 'a file'}, not a directory")
            else:
                pairs += _moves(src, dst, problems)
        elif (what := _kind_of(dst)) is not None:
            problems.append(f"{dst} is {what}, not a file")
        else:
            pairs.append((src, dst))
    return pairs


@contextmanager
def building(out: Path, kind: str, script: str) -> Iterator[Path]:
    """A temporary directory beside ``out`` to build ``script``'s output of ``kind`` in, marked when the block ends;
    its files then replace their namesakes in ``out`` (created when missing; kept: it may be a user's empty directory).
    ``out`` is locked first and checked again under the lock (:func:`checked_out`), so what another process wrote
    there meanwhile is refused, or kept beside the files, never replaced. Every namesake is checked before anything
    moves: when one is not a plain file (a directory where a file goes, a link, a special file), OutputError names it
    and ``out`` is left as it was."""
    with hold(out):
        checked_out(out, kind, script)
        sweep_beside(out)  # what a killed build left
        out.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent) as tmp:
            yield Path(tmp)
            write_marker(tmp, kind)
            problems: list[str] = []
            pairs = _moves(Path(tmp), out, problems)
            if problems:
                raise OutputError(f"--out {out}: {shown(problems)}, where this script writes a file of its own; nothing "
                                  "was changed: move it out of the directory, or choose another --out")
            for src, dst in pairs:
                if src.is_dir():
                    for f in src.rglob("*"):
                        fsync(f)
                fsync(src)
                os.replace(src, dst)
            for folder in sorted({dst.parent for _, dst in pairs} | {out}):
                fsync(folder)
