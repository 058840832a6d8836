"""Where ZipRL keeps its files, and how it writes them so that a crash never leaves a torn one.

- :func:`cache_root`: the one cache directory (converted models, corpora, indexes, Stage 1 runs, DeepSpeed's
  compiled ops): ``$ZIPRL_CACHE``, else ``~/.cache/ziprl`` (converted models, Stage 1 runs and compiled ops
  honour the configured ``model.cache_dir`` instead of the default).
  The old variable ``ZIPRL_CACHE_DIR`` is still read, with a DeprecationWarning, when ``ZIPRL_CACHE`` is unset.
- :func:`atomic_path` and its text / bytes / JSON variants: write beside the destination, fsync, rename onto it;
  the destination holds the old content or the new one, never a mix, and a failed write leaves no temp file.
- :func:`atomic_dir` and :func:`replace_dir`: the same for whole directories (checkpoints, models, indexes).
  :data:`LEFTOVER` matches the names of the temporaries these writes leave when the process is killed.
- :func:`file_sha256`: a file's sha256, read in chunks and memoised while its size and mtime stay the same;
  :func:`hash_file_into` feeds a file's bytes, in the same chunks, to a hash that covers more than one file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

# the temporary an atomic write of NAME leaves when killed: ``.NAME.<8 hex>.tmp`` (atomic_path), ``.NAME.<8 of
# [a-z0-9_]>.tmp`` (atomic_dir's mkdtemp) or ``.NAME.old-<8 hex>`` (replace_dir's old copy); group 1 is NAME
LEFTOVER = re.compile(r"\.(.+)\.(?:[a-z0-9_]{8}\.tmp|old-[0-9a-f]{8})")
CACHE_ENV = "ZIPRL_CACHE"
DEPRECATED_CACHE_ENV = "ZIPRL_CACHE_DIR"
DEFAULT_CACHE = "~/.cache/ziprl"


def cache_root(default: str | Path = DEFAULT_CACHE) -> Path:
    """ZipRL's cache directory: ``$ZIPRL_CACHE``, else ``$ZIPRL_CACHE_DIR`` (deprecated), else ``default``."""
    value = os.environ.get(CACHE_ENV)
    old = os.environ.get(DEPRECATED_CACHE_ENV)
    if old:
        used = "ignored because ZIPRL_CACHE is set" if value else "still read for now"
        warnings.warn(f"{DEPRECATED_CACHE_ENV} is deprecated ({used}): set {CACHE_ENV} instead",
                      DeprecationWarning, stacklevel=2)
    return Path(value or old or default).expanduser()


def fsync(path: str | Path) -> None:
    """Flush a file's or a directory's contents to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path beside ``path`` for the caller to write; fsynced and renamed onto ``path`` on success.

    On an exception the temp file is removed and ``path`` keeps its old content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented UTF-8 JSON (one trailing newline) to ``path`` atomically; returns ``path``."""
    return atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def replace_dir(src: Path, dst: Path) -> None:
    """Move directory ``src`` onto ``dst``; an existing ``dst`` is moved aside first and removed only afterwards."""
    old = dst.with_name(f".{dst.name}.old-{uuid.uuid4().hex[:8]}") if dst.exists() else None
    if old is not None:
        dst.rename(old)
    src.rename(dst)
    fsync(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A temp directory beside ``path`` for the caller to fill; fsynced and moved onto ``path`` on success.

    On an exception the temp directory is removed and ``path`` keeps its old content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            fsync(f)
        fsync(tmp)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def not_a_file(path: str | Path) -> str | None:
    """Why ``path`` cannot be read as a file ("does not exist", "is a directory", "is a FIFO (named pipe)", ...),
    or None for a regular file (a link to one included). Only ``stat`` is called: opening a FIFO blocks."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        return f"cannot be read ({exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return f"is {next((kind for test, kind in kinds if test(mode)), 'a special file')}, not a regular file"


def file_sha256(path: str | Path) -> str:
    """The sha256 (hex) of the file at ``path``, read in 1 MiB chunks; memoised per path, size and mtime."""
    st = os.stat(path)
    return _sha256_of(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    return hash_file_into(hashlib.sha256(), path).hexdigest()


def hash_file_into(h: Any, path: str | Path) -> Any:
    """``h`` (a hashlib object) updated with the bytes of the file at ``path``, read in 1 MiB chunks; returns ``h``."""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h
