"""A signal's stop at a chosen point, for the tests of the commands that stop and resume (sft, demos)."""

from __future__ import annotations

import signal
from collections.abc import Callable

from ziprl.loop.stop import Stop


def stop_after(n: int, checkpoint: bool = True) -> Callable[[], None]:
    """A ``stop`` callable that raises a SIGTERM's :class:`Stop` on its ``n``-th call (after the ``n``-th step or
    question); ``checkpoint`` False is a second signal's stop, which saves nothing."""
    calls = []

    def stop() -> None:
        calls.append(1)
        if len(calls) == n:
            raise Stop(signal.SIGTERM, checkpoint=checkpoint)

    return stop
