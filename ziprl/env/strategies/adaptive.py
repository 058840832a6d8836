"""``adaptive`` (ZipRL): the agent compresses each observation at a level it chooses by relevance."""

from __future__ import annotations

from ziprl.env.context import MemoryContext, Strategy
from ziprl.env.prompts import COMPRESS_FORMAT, MEMORY, head, level_table
from ziprl.registry import STRATEGIES


@STRATEGIES.register("adaptive", order=0)
class Adaptive(Strategy):
    compresses = True

    def system_prompt(self) -> str:
        return head(self.cfg) + MEMORY + (
            "First judge the observation's relevance to the question, then choose the level: strongly relevant "
            "-> fine (4-5), partly -> medium (3), weakly or not -> coarse (1-2). Stay in the level's range.\n"
            + level_table(self.cfg.scoring.level_scale) + "\n" + COMPRESS_FORMAT.format(level="N"))

    def new_context(self, question: str) -> MemoryContext:
        return MemoryContext.for_config(question, self.cfg)
