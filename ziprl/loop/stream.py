"""A resumable, seeded stream of question batches (the training data position)."""

from __future__ import annotations

import random
from typing import Any

from ziprl.config import ConfigError
from ziprl.retrieval.types import QAExample


class QuestionStream:
    """Yields batches of questions in a seeded order, reshuffled every epoch; ``position`` resumes exactly."""

    def __init__(self, examples: list[QAExample], seed: int = 0):
        if not examples:
            raise ConfigError("the question set is empty; check data.dataset / data.limit")
        self.examples, self.seed = examples, seed
        self.epoch, self.index = 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[QAExample]:
        out = []
        while len(out) < n:
            if self.index >= len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.examples[self._order[self.index]])
            self.index += 1
        return out

    @property
    def position(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "size": len(self.examples)}

    def restore(self, pos: dict[str, Any]) -> None:
        if pos.get("size") != len(self.examples) or pos.get("seed") != self.seed:
            raise ConfigError(f"data position {pos} does not match this question set "
                             f"(size {len(self.examples)}, seed {self.seed}); resume with the same data config")
        self.epoch, self.index = int(pos["epoch"]), int(pos["index"])
        self._order = self._shuffle()
