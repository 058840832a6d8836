"""The one output-path rule of every command that writes: train, launch, sft, index build/adopt, eval, demos, view.

- A command writes into a new path, or into one it marked earlier as its own, with its kind (:data:`KINDS`): a
  directory carries the marker file :data:`MARKER` (JSON: format, kind, creation time, command); a single-file
  output proves itself by its content (the demos file's Parquet metadata, the viewer report's generator tag).
- An existing file, or a directory that is not marked with the command's kind, is refused before anything is
  written. Replacing is opt-in (``--overwrite``) and deletes only the entries that kind writes, one by one, from a
  marked directory that holds nothing else; the working, home and root directories are never deleted.
- Paths are normalised before they are checked (``~``, ``..`` and symbolic links resolved, as
  :func:`os.path.realpath` does), so ``nosuch/../run`` is checked, and written, as ``run``.
- Nothing is followed or written through a symbolic link or a hard link (a file with another name) inside an
  output: such an output is refused, the offending entries named.
- A lock (:data:`LOCK` inside the directory, ``fcntl.flock``, holding its holder's PID) keeps a second process
  out while the first runs; the directory is checked again once the lock is held, since two processes can pass
  their plans before either writes.

A command calls :func:`plan_dir` (touches nothing) before any model loads, checks its other inputs, then claims
the directory with :func:`claim_dir` (lock, check again, delete what the plan replaces, mark) and writes inside
that block. Library functions that write into a directory they are handed call :func:`own_dir` instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError, printable
from ziprl.paths import LEFTOVER, atomic_write_json

MARKER, LOCK = ".ziprl-run", ".ziprl-lock"
MARKER_FORMAT = 1
KINDS = {"run": "a train/launch run", "sft": "an SFT run", "index": "a retrieval index", "eval": "an eval report",
         "bench": "a benchmark's working directory", "model": "a model directory export_model wrote",
         "data": "a generated data set", "bench-hrr_vs_grpo": "hrr_vs_grpo.py's working directory",
         "bench-retrieval_scale": "retrieval_scale.py's working directory",
         "example-trl_grpo": "examples/trl_grpo.py's output directory"}
DEFAULT_KIND = "run"  # a marker without a kind: written when runs were the only kind
SHOWN = 5  # offending entries named in an error


class OutputError(UserError):
    """An output path cannot be used as asked; the message says why and what to pass instead."""


@dataclass(frozen=True)
class OutputPlan:
    """What :func:`claim_dir` does: delete ``delete`` (a marked output's entries) from ``out``, create and mark it;
    with ``resume``, continue in it as it is."""

    out: Path
    kind: str
    owns: Callable[[str], bool]  # whether an entry (a relative path) is one this kind writes (:func:`entries`)
    overwrite: bool = False
    delete: tuple[Path, ...] = ()
    resume: bool = False


def shown(names: list[str]) -> str:
    """The first :data:`SHOWN` names, and how many there are in all."""
    return ", ".join(names[:SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > SHOWN else "")


def entries(*patterns: str) -> Callable[[str], bool]:
    r"""Whether an entry of an output (its path relative to the output, ``/``-separated) is one the output writes:
    the marker, the lock, a path matching one of ``patterns`` (regular expressions over the whole relative path, so
    a directory's contents are named too, e.g. ``tb(?:/events\.out\.tfevents\.[^/]+)?``), or a temporary copy of
    one (``.<name>.<anything>`` beside it, as atomic writes leave when killed) and everything inside that copy."""
    pattern = re.compile("|".join(f"(?:{p})" for p in (re.escape(MARKER), re.escape(LOCK), *patterns)))

    def owns(rel: str) -> bool:
        parts = rel.split("/")
        for i, part in enumerate(parts):
            dots = [k for k, ch in enumerate(part) if ch == "." and 1 < k < len(part) - 1] if part[:1] == "." else []
            if any(pattern.fullmatch("/".join([*parts[:i], part[1:k]])) for k in dots):
                return True
        return pattern.fullmatch(rel) is not None

    return owns


def normalise(path: str | Path) -> Path:
    """``path`` absolute, with ``~``, ``.``, ``..`` and symbolic links resolved; OutputError for a NUL byte."""
    try:
        return Path(os.path.realpath(Path(path).expanduser()))
    except ValueError:
        raise OutputError(f"output path {str(path)[:200]!r} holds a NUL byte; choose another path") from None


def _resolved(out_dir: str | Path) -> Path:
    """``out_dir`` normalised; OutputError for an empty path or a symbolic link to nothing."""
    if not str(out_dir).strip():
        raise OutputError("--out is empty; pass a path")
    raw = Path(out_dir).expanduser()
    if raw.is_symlink() and not raw.exists():
        raise OutputError(f"output {raw} is a symbolic link to nothing; remove the link or choose another --out")
    return normalise(raw)


def _check_writable(out: str | Path, target: Path) -> None:
    """OutputError unless this process can create a file in ``target`` or, when it is missing, the nearest folder
    above it that exists (tried, with an unnamed temporary file: permission bits say nothing for root)."""
    folder = target
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        why = exc.strerror or "no permission or a read-only file system"
        raise OutputError(f"--out {out}: cannot write in {folder} ({why}); choose a path in a directory you can "
                          "write") from None


# ---------------------------------------------------------------- the marker


def read_marker(out: Path) -> dict[str, Any] | None:
    """The marker in ``out`` (a regular file holding a JSON object with ``format``; ``kind`` filled in), or None."""
    path = out / MARKER
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or "format" not in data or not isinstance(data.get("kind", DEFAULT_KIND), str):
        return None
    return data | {"kind": data.get("kind", DEFAULT_KIND)}


def no_marker(out: Path) -> str:
    """Why ``out`` has no usable marker, as the rest of a sentence that starts with ``out``."""
    path = out / MARKER
    if path.is_symlink():
        return f"has a {MARKER} that is a symbolic link, not the marker file ZipRL writes"
    if path.is_dir():
        return f"has a {MARKER} that is a directory, not the marker file ZipRL writes"
    if os.path.lexists(path):
        return f"has a {MARKER} that is not a ZipRL marker (no JSON object with a format and a text kind)"
    return f"has no {MARKER} marker"


def write_marker(out: str | Path, kind: str, command: str | None = None) -> Path:
    """Mark ``out`` as an output of ``kind`` (atomically); ``command`` defaults to this process's arguments."""
    command = command if command is not None else " ".join(map(printable, [Path(sys.argv[0]).name, *sys.argv[1:]]))
    return atomic_write_json(Path(out) / MARKER, {"format": MARKER_FORMAT, "kind": kind, "created": time.strftime(
        "%Y-%m-%dT%H:%M:%S%z"), "command": command})


def _check_marker(out: Path, kind: str) -> None:
    """OutputError when the directory ``out`` holds a marker that is unusable or of another kind."""
    marker = read_marker(out)
    if marker is None and os.path.lexists(out / MARKER):
        raise OutputError(f"{out} {no_marker(out)}; nothing was written: remove it yourself, or choose another --out")
    if marker is not None and marker["kind"] != kind:
        what = KINDS.get(marker["kind"], f"a ZipRL output of kind {str(marker['kind'])[:40]!r}")
        raise OutputError(f"{out} is {as_directory(what)} (its {MARKER} says so), not {as_directory(KINDS[kind])}; "
                          "nothing was written: choose another --out")


def as_directory(what: str) -> str:
    """``what`` (a kind's description) as a directory: "an SFT run" -> "an SFT run directory"."""
    return what if "directory" in what else f"{what} directory"


# ---------------------------------------------------------------- links


def _is_link(st: os.stat_result) -> bool:
    return stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1)


def links_in(root: Path, names: Iterable[str] | None = None) -> list[str]:
    """Entries under ``root`` (relative paths; only under the top-level ``names`` when given) that are symbolic
    links or files with another name elsewhere (hard links); never follows a link."""
    found = []
    for name in sorted(os.listdir(root) if names is None else names):
        top = os.path.join(root, name)
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            continue
        if _is_link(st):
            found.append(name)
        elif stat.S_ISDIR(st.st_mode):
            for parent, dirs, files in os.walk(top):  # lists a link to a directory in dirs and does not enter it
                found += [os.path.relpath(p, root) for n in sorted(dirs + files)
                          if _is_link(os.lstat(p := os.path.join(parent, n)))]
    return found


def refuse_links(out: Path, names: Iterable[str] | None = None, flag: str = "") -> None:
    """OutputError naming the links :func:`links_in` finds (nothing is written through one)."""
    links = links_in(out, names)
    if links:
        raise OutputError(f"{flag}{out} holds links ({shown(links)}): symbolic links or files with another name "
                          "elsewhere (hard links), which ZipRL never creates and never writes through; nothing was "
                          "written: remove them yourself (their targets are not part of the output), or choose "
                          "another --out")


# ---------------------------------------------------------------- directories


def used(out: Path) -> bool:
    """Whether the directory ``out`` holds anything besides the marker, a lock (:func:`is_lock`) and what a killed
    write of the marker left (:func:`sweep_leftovers` removes it)."""
    return any(p.name != MARKER and not (p.name == LOCK and is_lock(p)) and not marker_leftover(p)
               for p in out.iterdir())


def marker_leftover(path: Path) -> bool:
    """Whether ``path`` is the temporary a killed write of the marker left (``..ziprl-run.<8 characters>.tmp``, a plain
    file, not a link)."""
    found = LEFTOVER.fullmatch(path.name)
    return found is not None and found[1] == MARKER and path.is_file() and not path.is_symlink()


def sweep_beside(target: Path) -> list[Path]:
    """Remove, and return, the temporary directories killed atomic writes of the directory ``target`` left beside it
    (:func:`ziprl.paths.atomic_dir`'s ``.<name>.<8 characters>.tmp``, :func:`ziprl.paths.replace_dir`'s
    ``.<name>.old-<8 hex>``); never a file or a link. Call it only while holding ``target``'s lock."""
    removed = []
    for path in target.parent.iterdir() if target.parent.is_dir() else ():
        found = LEFTOVER.fullmatch(path.name)
        if found and found[1] == target.name and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed.append(path)
    return removed


def sweep_leftovers(out: Path, owns: Callable[[str], bool]) -> list[str]:
    """Remove, from the whole tree of the output ``out``, the temporaries that killed atomic writes left of entries
    ``owns`` claims (:data:`ziprl.paths.LEFTOVER`: ``.<entry>.<8 characters>.tmp``, a directory
    ``.<entry>.old-<8 hex>``); never follows a link. Call it only
    while holding ``out``'s lock (no write of this output is running); returns the relative paths removed."""
    removed = []
    for parent, dirs, files in os.walk(out):
        rel = os.path.relpath(parent, out).replace(os.sep, "/")
        rel = "" if rel == "." else f"{rel}/"
        for name in [*dirs, *files]:
            found, path = LEFTOVER.fullmatch(name), os.path.join(parent, name)
            if found is None or os.path.islink(path) or not (name.endswith(".tmp") or os.path.isdir(path)) \
                    or not owns(rel + found[1]):  # an old- copy is a directory
                continue
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
            removed.append(rel + name)
        dirs[:] = [d for d in dirs if f"{rel}{d}" not in removed and owns(rel + d)]
    if removed:
        print(f"[outputs] removed {len(removed)} leftover(s) of interrupted writes in {out} "
              f"({shown(removed)})", file=sys.stderr, flush=True)
    return removed


def is_lock(path: Path) -> bool:
    """Whether ``path`` is a lock :func:`locked` wrote: a plain file holding a process id, or empty (killed before
    it wrote its id); a user's file of that name, whatever else it holds, is kept as it is."""
    try:
        st = os.lstat(path)
        text = path.read_bytes().strip() if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else b"x"
        return text.isdigit() or not text
    except OSError:
        return False


def checked_dir(out_dir: str | Path, kind: str) -> tuple[Path, bool]:
    """``out_dir`` normalised, and whether it is a directory in use; OutputError for a non-directory, a link to
    nothing, an unusable marker or a marker of another kind."""
    out = _resolved(out_dir)
    if os.path.lexists(out) and not out.is_dir():
        raise OutputError(f"--out {out} exists and is not a directory; {KINDS[kind]} is written into a directory: "
                          "pass a new one, or one this command wrote")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"--out {out}: {parent} is a file, not a directory; choose another --out")
    _check_writable(out_dir, out)
    if not out.is_dir():
        return out, False
    _check_marker(out, kind)
    return out, used(out)


def _guard_delete(out: Path) -> None:
    """Refuse to delete from a directory that holds the working directory or the home directory."""
    protected = [Path.cwd().resolve(), Path.home().resolve(), Path("/")]
    if any(out == p or out in p.parents for p in protected):
        raise OutputError(f"--overwrite would delete {out}, which holds the working or home directory; choose a "
                          "dedicated --out directory")


def plan_replace(out: Path, kind: str, owns: Callable[[str], bool]) -> tuple[Path, ...]:
    """The entries ``--overwrite`` deletes from the used directory ``out`` (all but the marker and the lock);
    OutputError, nothing touched, unless it is marked ``kind`` and every entry in its tree is one ``owns`` claims,
    none a link."""
    _guard_delete(out)
    names = sorted(p.name for p in out.iterdir())
    fix = "nothing was deleted"
    if read_marker(out) is None:
        raise OutputError(f"--overwrite: {out} {no_marker(out)}, so it is not known to be {KINDS[kind]} of ZipRL "
                          f"({shown(names)}); {fix}. If an older ZipRL wrote it, check it and delete it yourself; "
                          "otherwise choose another --out")
    foreign = [n for n in names if not owns(n)]
    if not foreign:
        refuse_links(out, flag="--overwrite: ")
        foreign = foreign_inside(out, names, owns)
    if foreign:
        raise OutputError(f"--overwrite: {out} holds entries {KINDS[kind]} does not write ({shown(foreign)}); {fix}: "
                          "move them out of the directory, or choose another --out")
    return tuple(out / n for n in names if n not in (MARKER, LOCK))


def foreign_inside(out: Path, names: Iterable[str], owns: Callable[[str], bool]) -> list[str]:
    """The entries under the top-level directories ``names`` of ``out`` (relative paths) that ``owns`` does not
    claim: a user's file left in ``checkpoints/`` is not deleted with it. Never follows a link."""
    found = []
    for name in names:
        if not os.path.isdir(top := os.path.join(out, name)) or os.path.islink(top):
            continue
        for parent, dirs, files in os.walk(top):
            rel = os.path.relpath(parent, out).replace(os.sep, "/")
            found += [f"{rel}/{n}" for n in sorted(dirs + files) if not owns(f"{rel}/{n}")]
            dirs[:] = [d for d in dirs if owns(f"{rel}/{d}")]  # a foreign directory is named, not its contents
    return found


def plan_dir(out_dir: str | Path, kind: str, overwrite: bool, owns: Callable[[str], bool],
             fix: str = "pass --overwrite to replace it, or choose another --out", resume: bool = False) -> OutputPlan:
    """Check what a command of ``kind`` may do with ``out_dir``, touching nothing: a new or empty directory is used,
    a used one only with ``overwrite`` (see :func:`plan_replace`) or, to continue in it, ``resume`` (only one marked
    ``kind`` and holding no link); ``fix`` ends the message for a used one."""
    if resume and overwrite:
        raise OutputError("--resume and --overwrite contradict each other: pass one (continue, or replace)")
    out, in_use = checked_dir(out_dir, kind)
    refuse_held(out)
    if resume:
        if not in_use:
            raise OutputError(f"--resume: {out} holds nothing to continue; drop --resume")
        if read_marker(out) is None:
            raise OutputError(f"--resume: {out} {no_marker(out)}, so it is not known to be {KINDS[kind]} of ZipRL; "
                              "nothing was written: choose another --out")
        refuse_links(out, flag="--resume: ")
        return OutputPlan(out, kind, owns, resume=True)
    if in_use and not overwrite:
        names = sorted(p.name for p in out.iterdir())
        if read_marker(out) is None:  # not ZipRL's: neither --resume nor --overwrite may touch it
            older = "pass --resume to continue it if an older ZipRL run wrote it, or " if kind == "run" else ""
            raise OutputError(f"output directory {out} is not empty ({shown(names)}) and {no_marker(out)}, so it is "
                              f"not known to be {KINDS[kind]}; nothing was written: {older}choose another --out")
        raise OutputError(f"output directory {out} is not empty ({shown(names)}); {fix}")
    return OutputPlan(out, kind, owns, overwrite, plan_replace(out, kind, owns) if in_use else ())


def refuse_inputs_inside(deleted: Iterable[Path], inputs: Iterable[str | Path | None]) -> None:
    """OutputError, nothing touched, when one of ``inputs`` (paths the command reads; None for one not given) is, or
    lies inside, an entry ``--overwrite`` would delete: checked before the delete, the input would be gone after."""
    gone = [Path(p).resolve() for p in deleted]
    for given in filter(None, inputs if gone else ()):
        path = Path(given).expanduser().resolve()
        for entry in gone:
            if path == entry or entry in path.parents:
                raise OutputError(f"--overwrite would delete {entry}, which holds the input {given}; nothing was "
                                  "deleted: move that input out of --out, or choose another --out")


def delete(paths: Iterable[Path]) -> None:
    """Delete planned entries; rmtree refuses a symbolic link and never follows one inside."""
    for entry in paths:
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


@contextmanager
def locked(out: Path, wait: bool = False) -> Iterator[None]:
    """Hold the lock of the directory ``out`` (created when missing) while the block runs; when another process
    holds it, OutputError naming the holder's PID (``wait``: wait until it ends instead)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # a symbolic link (ELOOP), a directory (EISDIR)
        raise OutputError(f"{path} is not a lock file ZipRL can use ({exc.strerror}); remove it yourself, or choose "
                          "another --out") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise OutputError(f"{path} is not a plain lock file (a special file or a hard link); remove it "
                              "yourself, or choose another --out")
        if not _flock_soon(fd):
            if not wait:
                raise OutputError(f"{out} is in use by {lock_holder(fd)} (it holds {path}); wait until it ends, or "
                                  "choose another --out") from None
            print(f"[outputs] waiting for {lock_holder(fd)}, which is writing {out}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def lock_path(out: str | Path) -> Path:
    """The lock file of a command writing ``out`` (:func:`hold`): ``.<name>.ziprl-lock`` beside it."""
    out = Path(out)
    return out.with_name(f".{out.name}{LOCK}")


@contextmanager
def hold(out: Path) -> Iterator[None]:
    """Hold the lock of the output ``out`` (a file, or a directory written whole; its folder created when missing)
    while the block runs, then remove the lock file; OutputError, nothing touched, when another process holds it or
    the name is a file ZipRL did not write."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(out)
    while True:  # a lock file its holder removed as it ended is opened again: the next holder's is a new one
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(fd)
            os.close(fd)
            raise OutputError(f"{out} is in use by {holder} (it holds {path}); wait until it ends, or choose another "
                              "--out") from None
        if _is_open_at(fd, path):
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        if _is_open_at(fd, path):  # removed while still locked, so no other process takes it in between
            path.unlink()
        os.close(fd)


def _open_lock(path: Path) -> int:
    """``path`` opened (created when missing); OutputError, the file kept, unless it is a lock :func:`hold` wrote: a
    plain file with one name, empty or holding a process id."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # a symbolic link (ELOOP), a directory (EISDIR), a name too long
        raise OutputError(f"{path} is not a lock file ZipRL can use ({exc.strerror}); remove it yourself, or choose "
                          "another --out") from None
    st = os.fstat(fd)
    text = os.pread(fd, 33, 0).strip() if stat.S_ISREG(st.st_mode) else b"x"
    if st.st_nlink > 1 or len(text) > 32 or not (text.isdigit() or not text):
        os.close(fd)
        raise OutputError(f"{path} is not a lock file ZipRL wrote; nothing was written: remove it yourself, or choose "
                          "another --out")
    return fd


def _is_open_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the one named ``path``."""
    try:
        st, named = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (named.st_dev, named.st_ino)


def _flock_soon(fd: int, seconds: float = 0.2) -> bool:
    """Whether this process took ``fd``'s exclusive lock within ``seconds`` (:func:`refuse_held`'s probe holds a
    shared one for a moment)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def refuse_held(out: Path) -> None:
    """OutputError naming the process when another one holds the lock of the directory ``out`` (:func:`locked`):
    said before what ``--resume`` or ``--overwrite`` would do there. Touches nothing; a missing lock is not
    created."""
    try:
        fd = os.open(out / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # none, or not a lock file (locked() names that)
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or lock_holder(fd) == f"process {os.getpid()}":
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(f"{out} is in use by {lock_holder(fd)} (it holds {out / LOCK}); wait until it ends, or "
                              "choose another --out") from None
    finally:
        os.close(fd)


def lock_holder(fd: int) -> str:
    """The process that holds a lock, as its lock file says."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return f"process {text}" if text.isdigit() else "another process"


@contextmanager
def claim_dir(plan: OutputPlan, command: str | None = None) -> Iterator[Path]:
    """Lock ``plan.out``, plan again under the lock, delete what that plan replaces and mark the directory
    (``command`` goes into the marker); yields it, locked until the block ends."""
    with locked(plan.out):
        fresh = plan_dir(plan.out, plan.kind, plan.overwrite, plan.owns, resume=plan.resume)
        delete(fresh.delete)
        if fresh.out.is_dir():
            sweep_leftovers(fresh.out, fresh.owns)
        if not fresh.resume:  # a continued output keeps the marker of the command that began it
            write_marker(fresh.out, fresh.kind, command)
        yield fresh.out


def own_dir(out_dir: str | Path, kind: str, writes: Iterable[str], mark: bool = True) -> Path:
    """Where a library function of ``kind`` writes the top-level entries ``writes``: ``out_dir`` normalised, and,
    with ``mark``, created and marked (when it has no marker yet). OutputError, nothing written, for an existing
    non-directory, a directory marked another kind, an unmarked one that already holds one of ``writes``, and a
    link among ``writes``. Commands plan and claim their directory first (:func:`plan_dir`, :func:`claim_dir`);
    this keeps their library callers (Stage 1's cache, benchmarks) from writing over what is not theirs."""
    out, in_use = checked_dir(out_dir, kind)
    taken = [n for n in writes if os.path.lexists(out / n)] if in_use else []
    if taken and read_marker(out) is None:
        raise OutputError(f"{out} {no_marker(out)} and already holds {shown(taken)}, which {KINDS[kind]} would "
                          "replace; nothing was written: choose another output directory")
    refuse_links(out, taken)
    if mark:
        out.mkdir(parents=True, exist_ok=True)
        if read_marker(out) is None:
            write_marker(out, kind)
    return out


def work_dir(out_dir: str | Path, kind: str) -> Path:
    """A directory a long job writes into and, run again, continues from (a benchmark's runs and evaluations):
    ``out_dir`` normalised, created and marked when new or empty, reused when marked with ``kind``; OutputError,
    nothing written, for a file, a link inside it, or a used directory that is not marked with ``kind``."""
    out, in_use = checked_dir(out_dir, kind)
    if in_use and read_marker(out) is None:
        names = sorted(p.name for p in out.iterdir())
        raise OutputError(f"output directory {out} is not empty ({shown(names)}) and {no_marker(out)}, so it is not "
                          f"known to be {KINDS[kind]}; nothing was written: choose another --out")
    if in_use:
        refuse_links(out)
    out.mkdir(parents=True, exist_ok=True)
    if read_marker(out) is None:
        write_marker(out, kind)
    return out


# ---------------------------------------------------------------- single files


def check_file(out: str | Path, overwrite: bool, written_by: Callable[[Path], bool], what: str, example: str) -> Path:
    """``out`` normalised, once a single-file output may be written there: a new path, or, with ``overwrite``, a
    regular file that ``written_by`` proves is ``what`` (e.g. "a demos file ziprl.demos wrote"). OutputError,
    nothing written, otherwise; ``example`` names a file for the message about a directory."""
    path = _resolved(out)
    if path.is_dir():
        raise OutputError(f"--out {out} is a directory; pass a file path, e.g. {Path(out) / example}")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"--out {out}: {parent} is a file, not a directory; choose another --out")
    _check_writable(out, path.parent)
    if not os.path.lexists(path):
        return path
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        raise OutputError(f"--out {out} exists and is not a plain file (a special file, or a file with another name "
                          "elsewhere); nothing was written: choose another --out")
    if not written_by(path):
        raise OutputError(f"--out {out} exists and is not {what}; refusing to replace it: choose another --out")
    if not overwrite:
        raise OutputError(f"--out {out} exists ({what}); pass --overwrite to replace it, or choose another --out")
    return path
