"""The one error boundary of every command (:func:`run_command`), and :class:`UserError`, the base of the errors it
reports: bad input is one line on stderr and exit code 2, never a traceback.

Decorate a command's ``main(argv)`` with :func:`run_command`. ``--debug`` anywhere in the arguments shows the
full traceback instead. Errors a user can fix exit with 2: a :class:`UserError` (ConfigError, DatasetError,
CorpusError, RetrieverError, ModelPathError, RunDirError, ...: raised where the library checks its input, with a
message naming the problem and the fix), a path that is missing, unreadable or of the wrong kind, or a missing
package. Anything else (a bare KeyError, ValueError, OSError, ... from inside the library) is a bug and exits
with 1, still on one line, asking for a ``--debug`` rerun. Stdlib only, so every layer may raise its errors.
"""

from __future__ import annotations

import functools
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
DEBUG_FLAG = "--debug"


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (KeyError's quotes dropped), prefixed by its type when it has none.

    An OSError that carries only the system's text (``[Errno 2] No such file or directory: 'x'``) is written as
    ``x: No such file or directory; <the fix>``.
    """
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror and len(exc.args) == 2:
        fix = next((fix for kind, fix in PATH_ERRORS.items() if isinstance(exc, kind)), "check the path")
        return f"{exc.filename}: {exc.strerror}; {fix}"
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    text = " ".join(str(msg).split())
    return text or type(exc).__name__


def run_command(main: Callable[[list[str]], int | None]) -> Callable[[list[str] | None], int]:
    """Wrap ``main(argv) -> exit code``: strips ``--debug``, turns exceptions into one ``error:`` line."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        debug = DEBUG_FLAG in args
        args = [a for a in args if a != DEBUG_FLAG]
        try:
            return main(args) or 0
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            if debug:
                raise
            if isinstance(exc, USER_ERRORS):
                print(f"error: {one_line(exc)}", file=sys.stderr)
                return 2
            print(f"internal error ({type(exc).__name__}): {one_line(exc)}; rerun with {DEBUG_FLAG} for the traceback "
                  "and report it", file=sys.stderr)
            return 1

    return wrapped
