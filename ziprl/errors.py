"""The one error boundary of every command: bad input is one line on stderr and exit code 2, never a traceback.

Decorate a command's ``main(argv)`` with :func:`run_command`. ``--debug`` anywhere in the arguments shows the
full traceback instead. Errors a user can fix (ConfigError and the other ValueErrors the library raises with a
message that names the fix, missing files, missing packages) exit with 2; anything else is a bug and exits
with 1, still on one line, asking for a ``--debug`` rerun.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

USER_ERRORS = (ValueError, OSError, KeyError, ImportError)  # ConfigError, DatasetError, ModelPathError, ...
DEBUG_FLAG = "--debug"


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (KeyError's quotes dropped), prefixed by its type when it has none."""
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
