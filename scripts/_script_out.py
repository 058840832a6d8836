"""The output rule of the scripts that write a directory (make_invented.py, make_sample.py, viewer_demo_run.py):
the directory is new, empty, or an earlier output of the same script (its marker, :data:`ziprl.outputs.MARKER`,
names the script); anything else is refused before anything is written. A rerun replaces only the files the
script writes, by name; nothing is deleted."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ziprl.outputs import MARKER, OutputError, checked_dir, read_marker, refuse_links, shown, write_marker
from ziprl.paths import atomic_dir, fsync


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
    return out


@contextmanager
def building(out: Path, kind: str) -> Iterator[Path]:
    """A temporary directory beside ``out`` to build an output of ``kind`` in (checked by :func:`checked_out`),
    marked when the block ends: it then becomes ``out`` when ``out`` is new; otherwise its files replace their
    namesakes in ``out``, which is kept (it may be a user's empty directory)."""
    if not out.exists():
        with atomic_dir(out) as tmp:
            yield tmp
            write_marker(tmp, kind)
        return
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        yield Path(tmp)
        write_marker(tmp, kind)
        for f in sorted(Path(tmp).iterdir()):
            fsync(f)
            os.replace(f, out / f.name)
        fsync(out)
