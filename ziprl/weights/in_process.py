"""The in-process transport: the learner and the engine share this process, so a push is one copy and a load."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ziprl.weights import WeightReceiver, WeightSender


class InProcess(WeightSender):
    """The push into this process's engine: ``weights(device, dtype)`` (the learner's name -> tensor, copied where and
    as the engine takes them: on its GPU, in its dtype, no host round trip) -> ``load_weights`` inside ``guard``
    (the rollout source's lock while a job generates beside the learner, ``rollout.overlap=thread``: the load waits
    for that job, timed as ``wait_seconds``)."""

    def __init__(self, weights: Callable[[str, str], dict[str, Any]], engine: WeightReceiver,
                 guard: AbstractContextManager[Any] | None = None):
        self.weights, self.engine = weights, engine
        self.guard = contextlib.nullcontext() if guard is None else guard

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        arrays = self.weights(self.engine.weights_device, self.engine.weights_dtype)
        t1 = time.perf_counter()
        with self.guard:
            waited = time.perf_counter() - t1
            self.engine.load_weights(arrays, version)
        return {"seconds": time.perf_counter() - t0 - waited, "wait_seconds": waited,
                "bytes": float(sum(a.nbytes for a in arrays.values()))}

    def close(self) -> None:
        """Nothing to release: the engine belongs to the caller."""
