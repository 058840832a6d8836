"""A plug-in tool as a newcomer would write one: ``<echo>text</echo>`` returns the text reversed."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.env.tools import Tool, ToolResult


class Echo(Tool):
    """A tool that returns its argument reversed: what a newcomer's plug-in file would hold."""

    stats_key = "echoes"

    def describe(self, cfg: EnvConfig) -> str:
        return "<echo>text</echo> returns the text reversed"

    def run(self, env, argument: str, written: str) -> ToolResult:
        if not argument.isascii():
            raise ValueError("ASCII only")
        from ziprl.env.context import Observation

        return ToolResult(Observation(env.turn, f"echo {argument}", argument[::-1]))
