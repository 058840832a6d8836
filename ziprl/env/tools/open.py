"""``<open>doc-id</open>``: one passage in full (its first ``env.open_max_chars`` characters; never noised)."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.env.context import Observation
from ziprl.env.protocol import format_passage, parse_hits
from ziprl.env.tools import Tool, ToolResult, seen_labels
from ziprl.registry import TOOLS


def label(doc_id: str) -> str:
    return f"open {doc_id[:200]}"


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
        return ToolResult(Observation(env.turn, label(argument), text), retrieved=1)

    def demonstrate(self, plan, env) -> str | None:
        """Open the hit ``search`` found for the supporting title it just finished (``plan.to_open``)."""
        doc, plan.to_open = plan.to_open, None
        if doc is not None:
            plan.opened.add(doc)
        return doc

    def candidates(self, env) -> list[str]:
        """Each doc id of pending search results, not opened yet."""
        pending = env.context.pending
        if pending is None or pending.tool != "search":
            return []
        seen = seen_labels(env)
        return [doc for doc in dict.fromkeys(doc for doc, _ in parse_hits(pending.text)) if label(doc) not in seen]
