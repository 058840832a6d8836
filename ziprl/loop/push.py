"""The weight push: how the learner's new weights reach every rollout worker after a step.

The loop calls ``push(version)`` after each learner step (and once after a resume) and the caller ``close()``
at the end. :class:`ziprl.loop.in_process.InProcessPush` loads the learner's weights into this process's engine;
``ziprl.actors.weight_sync.WeightSync`` sends them to the Ray rollout actors (``weights.transport``).
"""

from __future__ import annotations

from typing import Protocol


class WeightPush(Protocol):
    """Gives every rollout worker the learner's current weights, tagged with their policy version."""

    def push(self, version: int) -> dict[str, float]:
        """Push the weights of ``version``; every worker applies them before its next job. {"seconds", "bytes"}."""
        ...

    def close(self) -> None:
        """Release the transport (the learner and the workers stay up)."""
        ...
