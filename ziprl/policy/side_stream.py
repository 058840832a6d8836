"""Generation beside the learner on one GPU: the rollout's CUDA work on a stream of its own
(``rollout.overlap=thread``, :class:`ziprl.loop.in_process.InProcessSource`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

# Held while a CUDA graph is captured (the static decode's), and by the work of other threads that could break a
# capture in flight: a device-wide synchronize fails it ("operation not permitted when stream is capturing"), and a
# draw from the default CUDA generator meanwhile leaves that generator unusable ("Offset increment outside graph
# capture"). The in-process learner's step and checkpoint hold it (ziprl.loop.training.LocalLearner).
CAPTURE_LOCK = threading.Lock()


def side_stream(device: str) -> Callable[[], AbstractContextManager[None]]:
    """A context for the work of one rollout job on ``device``; a no-op off CUDA.

    On CUDA the work inside runs on one stream kept for it (the same at every entry, so the allocator reuses the
    blocks it cached for that stream), after what was queued before on the device's default stream (a weight push),
    and is waited for on exit (so a push after it may overwrite the weights the job read)."""
    if not device.startswith("cuda"):
        return contextlib.nullcontext
    import torch

    stream = torch.cuda.Stream(torch.device(device))

    @contextlib.contextmanager
    def on_stream() -> Iterator[None]:
        stream.wait_stream(torch.cuda.default_stream(stream.device))
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            stream.synchronize()

    return on_stream
