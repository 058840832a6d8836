"""``uniform``: as adaptive, but every note gets the one level ``env.uniform_level`` (the theorem's uniform
allocation)."""

from __future__ import annotations

from ziprl.env.context import MemoryContext, Strategy
from ziprl.env.prompts import COMPRESS_FORMAT, MEMORY, head
from ziprl.registry import STRATEGIES
from ziprl.scoring.levels import level_spec


@STRATEGIES.register("uniform", order=1)
class Uniform(Strategy):
    compresses = True

    @property
    def fixed_level(self) -> int:
        return self.cfg.uniform_level

    def system_prompt(self) -> str:
        g = self.cfg.uniform_level
        s = level_spec(g, self.cfg.scoring.level_scale)
        return (head(self.cfg) + MEMORY + f"Always use level {g} ({s.char_low}-{s.char_high} chars).\n"
                + COMPRESS_FORMAT.format(level=g))

    def new_context(self, question: str) -> MemoryContext:
        return MemoryContext.for_config(question, self.cfg)
