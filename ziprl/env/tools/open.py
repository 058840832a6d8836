"""``<open>doc-id</open>``: one passage in full (its first ``env.open_max_chars`` characters; never noised)."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.env.context import Observation
from ziprl.env.protocol import format_passage
from ziprl.env.tools import Tool, ToolResult
from ziprl.registry import TOOLS


@TOOLS.register("open", order=1)
class Open(Tool):
    stats_key = "opens"

    def describe(self, cfg: EnvConfig) -> str:
        return "<open>doc-id</open> shows one passage in full"

    def run(self, env, argument: str, written: str) -> ToolResult:
        try:
            try:
                p = env.retriever.open(argument)
            except KeyError:
                p = env.retriever.open(written)  # the id as written, if it holds '&'
        except KeyError:
            return ToolResult(error=f"no document with id {argument[:200]!r}; open an id shown in search results")
        text = format_passage(p, env.config.open_max_chars)
        return ToolResult(Observation(env.turn, f"open {argument[:200]}", text), retrieved=1)
