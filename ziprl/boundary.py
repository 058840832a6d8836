"""The one error boundary of every command (:func:`run_command`), and :class:`UserError`, the base of the errors it
reports: bad input is one line on stderr and exit code 2, never a traceback.

Decorate a command's ``main(argv)`` with :func:`run_command`. ``--debug`` anywhere in the arguments shows the
full traceback instead. Errors a user can fix exit with 2: a :class:`UserError` (ConfigError, DatasetError,
CorpusError, RetrieverError, ModelPathError, RunDirError, ...: raised where the library checks its input, with a
message naming the problem and the fix), a path that is missing, unreadable or of the wrong kind, a missing
package, and a condition of the machine (a full disk, a read-only file system: :data:`OS_CONDITIONS`; a NUL byte in a
path). Anything else (a bare KeyError, ValueError, OSError, ... from inside the library) is a bug and exits with 1, still
on one line, asking for a ``--debug`` rerun. A long value in a message is shortened (:func:`shown`). Stdlib only, so
every layer may raise its errors.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input that the user can fix; the message names the problem and the fix. Commands exit 2 on it."""


PATH_ERRORS = {  # OSErrors about a path the user gave, and the fix each asks for
    FileNotFoundError: "check the path",
    PermissionError: "check its permissions or choose another path",
    IsADirectoryError: "pass a file, not a directory",
    NotADirectoryError: "a part of the path is a file, not a directory; check the path",
    FileExistsError: "choose another path",
}
USER_ERRORS = (UserError, ImportError, *PATH_ERRORS)
OS_CONDITIONS = {  # errno of a condition of the machine, not of the program: the fix each asks for
    errno.ENOSPC: "free some disk space or choose a location on another disk",
    errno.EDQUOT: "free some space within your disk quota or choose a location on another disk",
    errno.EROFS: "the file system is read-only: choose a writable location",
    errno.EFBIG: "the file is larger than its file system or this process's file-size limit (ulimit -f) allows: "
                 "raise the limit or choose a location on another file system",
    errno.ENAMETOOLONG: "shorten the path",
    errno.ELOOP: "a symbolic link in the path loops or is one that is not followed; check the path",
}
NUL_ERRORS = ("embedded null byte", "embedded null character")  # os and pathlib's ValueError for a NUL in a path
DEBUG_FLAG = "--debug"
MAX_SHOWN = 80  # characters of one value that a message shows
MAX_WORD = 120  # a longer run of non-space characters in a message is shortened
MAX_MESSAGE = 1000  # a longer message keeps its start and its end (the fix)


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``repr(value)``, cut to ``limit`` characters with the value's length named when longer."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str | bytes | list | dict) else len(text)
    return f"{text[:limit]}... ({size} {'chars' if isinstance(value, str) else 'long'})"


def _shorten(text: str) -> str:
    """``text`` with every over-long word, and then an over-long whole, cut (their lengths named)."""
    text = re.sub(rf"\S{{{MAX_WORD + 1},}}", lambda m: f"{m[0][:MAX_SHOWN]}...({len(m[0])} chars)", text)
    if len(text) <= MAX_MESSAGE:
        return text
    head, tail = MAX_MESSAGE * 2 // 3, MAX_MESSAGE // 3
    return f"{text[:head]} ...({len(text) - head - tail} chars cut)... {text[-tail:]}"


def os_condition(exc: BaseException) -> int | None:
    """The errno of :data:`OS_CONDITIONS` that ``exc`` reports, also when a library (pyarrow, safetensors, torch)
    only names it in its text; None for anything else."""
    if isinstance(exc, OSError) and exc.errno in OS_CONDITIONS:
        return exc.errno
    text = str(exc)
    return next((code for code in OS_CONDITIONS if os.strerror(code) in text), None)


def _is_user_error(exc: BaseException) -> bool:
    return (isinstance(exc, USER_ERRORS) or os_condition(exc) is not None
            or (isinstance(exc, ValueError) and str(exc) in NUL_ERRORS))


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (KeyError's quotes dropped), prefixed by its type when it has none.

    An OSError that carries only the system's text (``[Errno 2] No such file or directory: 'x'``) is written as
    ``x: No such file or directory; <the fix>``.
    A condition of :data:`OS_CONDITIONS` names its path (where the error carries it) and the fix; a NUL byte in
    a path says to remove it. Over-long values are shortened.
    """
    while isinstance(exc, UserError) and isinstance(getattr(exc, "cause", None), UserError):
        exc = exc.cause  # Ray's RayTaskError(<the actor's error>): that error's own message, not Ray's dump
    code = None if isinstance(exc, UserError) else os_condition(exc)
    if code is not None and isinstance(exc, OSError) and exc.errno == code:
        where = "" if exc.filename is None else f"{exc.filename}: "
        return _shorten(f"{where}{os.strerror(code)}; {OS_CONDITIONS[code]}")
    if code is not None:  # a library's own error naming the condition: its text (the file, often) and the fix
        return _shorten(f"{' '.join(str(exc).split())}; {OS_CONDITIONS[code]}")
    if isinstance(exc, ValueError) and str(exc) in NUL_ERRORS:
        return "a path holds a NUL byte (\\0); remove it from the path (check the arguments and the config's paths)"
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror and len(exc.args) == 2:
        fix = next((fix for kind, fix in PATH_ERRORS.items() if isinstance(exc, kind)), "check the path")
        return _shorten(f"{exc.filename}: {exc.strerror}; {fix}")
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    text = " ".join(str(msg).split())
    return _shorten(text) or type(exc).__name__


STDOUT = "standard output"


class _NamedStdout:
    """Standard output while a command runs: a write or flush that fails on a condition of :data:`OS_CONDITIONS` (a
    full disk behind ``> file``) raises an OSError naming it; everything else is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        return self._named(self._stream.write, text)

    def flush(self) -> None:
        self._named(self._stream.flush)

    @staticmethod
    def _named(call, *args):
        try:
            return call(*args)
        except OSError as exc:
            if exc.errno in OS_CONDITIONS:
                raise OSError(exc.errno, exc.strerror, STDOUT) from None
            raise


def _drop_stdout(stream) -> None:
    """Point ``stream``'s file at /dev/null: the interpreter's own flush at exit would fail again."""
    with contextlib.suppress(OSError, ValueError):  # no file behind it (a test's capture): nothing flushes it at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def printable(arg: str) -> str:
    """A command-line argument as text: bytes that are not UTF-8 (which Python keeps as lone surrogates) as ``\\xNN``
    escapes, so a marker or a result can record any argument a path may hold."""
    return arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def not_utf8(args: list[str]) -> str | None:
    """Why ``args`` cannot be taken (an argument whose bytes are not UTF-8, kept by Python as lone surrogates, which
    no file written or library called may hold), or None."""
    for i, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return (f"argument {i} ('{printable(arg)[:80]}') is not UTF-8 text; nothing was done: give paths and text "
                    "in UTF-8")
    return None


def run_command(main: Callable[[list[str]], int | None]) -> Callable[[list[str] | None], int]:
    """Wrap ``main(argv) -> exit code``: strips ``--debug``, turns exceptions into one ``error:`` line."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        debug = DEBUG_FLAG in args
        args = [a for a in args if a != DEBUG_FLAG]
        bad = not_utf8(args)
        if bad:
            print(f"error: {bad}", file=sys.stderr)
            return 2
        stdout, sys.stdout = sys.stdout, _NamedStdout(sys.stdout)
        try:
            code = main(args) or 0
            sys.stdout.flush()
            return code
        except KeyboardInterrupt as exc:  # Ctrl-C, or a run stopped by a signal (its exit_code: 128 + the signal)
            print("interrupted", file=sys.stderr)
            return getattr(exc, "exit_code", 130)
        except Exception as exc:
            if getattr(exc, "filename", None) == STDOUT:
                _drop_stdout(stdout)
            if debug:
                raise
            if _is_user_error(exc):
                print(f"error: {one_line(exc)}", file=sys.stderr)
                return 2
            print(f"internal error ({type(exc).__name__}): {one_line(exc)}; rerun with {DEBUG_FLAG} for the traceback "
                  "and report it", file=sys.stderr)
            return 1
        finally:
            sys.stdout = stdout

    return wrapped
