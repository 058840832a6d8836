"""Stopping a training run on SIGINT or SIGTERM where its checkpoint is exact.

The loop spends most of its time waiting for rollouts. A stop requested there is raised at once: the learner is
between updates and the scheduler's books are whole, so a checkpoint of that moment is exact (the jobs in flight are
re-run on resume). One requested anywhere else (the optimiser step, the weight push, the step's files and
checkpoint, the scheduler's bookkeeping) waits for the end of the step, so a checkpoint never holds half an
optimiser step or loses a question. A second signal while the first waits stops at once, without that checkpoint:
the run keeps its last whole one. A signal ignored when the run started (``nohup``) stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop(KeyboardInterrupt):
    """A stop requested by signal ``signum``; ``checkpoint`` says whether the loop is at a point to write one."""

    def __init__(self, signum: int, checkpoint: bool = True):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.checkpoint = signum, checkpoint

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by this signal (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


class StopSignals:
    """While entered (in the main thread; elsewhere it does nothing), SIGINT and SIGTERM request a stop, raised as
    :class:`Stop` at once inside :meth:`at_once` and else at the next :meth:`check`. The handlers found on entry are
    put back on exit. ``name`` (the command) leads the message a first signal prints."""

    def __init__(self, name: str = "train") -> None:
        self.name = name
        self.requested: int | None = None
        self._at_once = False
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                old = signal.getsignal(s)
                if old is not signal.SIG_IGN:
                    self._saved[s] = signal.SIG_DFL if old is None else old  # None: a handler set outside Python
                    signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._saved.items():
            signal.signal(s, old)
        self._saved.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            raise Stop(signum, checkpoint=False)
        self.requested = signum
        if self._at_once:
            raise Stop(signum)
        print(f"\n[{self.name}] {signal.Signals(signum).name}: stopping at the end of this step, with a checkpoint; signal "
              "again to stop at once without one", file=sys.stderr, flush=True)

    def check(self) -> None:
        """Raise the stop requested so far, if any."""
        if self.requested is not None:
            raise Stop(self.requested)

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """A section a stop may break into (a wait that changes nothing): one requested before or during it is
        raised."""
        self._at_once = True
        try:
            self.check()  # one requested before the flag was set
            yield
        finally:
            self._at_once = False


class StoppableSource:
    """A rollout source whose :meth:`wait` is the loop's one place to stop at once (see the module docstring)."""

    def __init__(self, source: Any, stop: StopSignals):
        self._source, self._stop = source, stop

    def wait(self) -> Any:
        with self._stop.at_once():
            return self._source.wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)
