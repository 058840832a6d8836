"""The in-process transport: the learner and the engine share this process, so a push is one copy and a load."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ziprl.weights import WeightReceiver, WeightSender


class InProcess(WeightSender):
    """The push into this process's engine: ``weights(device, dtype)`` (the learner's name -> tensor, copied where and
    as the engine takes them: on its GPU, in its dtype, no host round trip) -> ``load_weights``."""

    def __init__(self, weights: Callable[[str, str], dict[str, Any]], engine: WeightReceiver):
        self.weights, self.engine = weights, engine

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        arrays = self.weights(self.engine.weights_device, self.engine.weights_dtype)
        self.engine.load_weights(arrays, version)
        return {"seconds": time.perf_counter() - t0, "bytes": float(sum(a.nbytes for a in arrays.values()))}

    def close(self) -> None:
        """Nothing to release: the engine belongs to the caller."""
