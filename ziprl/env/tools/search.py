"""``<search>query</search>``: the top ``env.top_k`` passages (optionally noised, ``env.retrieval_noise``)."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.env.context import Observation
from ziprl.env.protocol import format_hits
from ziprl.env.tools import Tool, ToolResult
from ziprl.registry import TOOLS
from ziprl.retrieval.noise import inject_noise


@TOOLS.register("search", order=0)
class Search(Tool):
    stats_key = "searches"

    def describe(self, cfg: EnvConfig) -> str:
        return f"<search>query</search> returns the top {cfg.top_k} passages as [doc-id] title + snippet"

    def run(self, env, argument: str, written: str) -> ToolResult:
        c = env.config
        hits, injected = inject_noise(env.retriever.search([argument], c.top_k)[0], c.retrieval_noise,
                                      env.retriever, env.noise)
        return ToolResult(Observation(env.turn, f'search "{argument[:200]}"', format_hits(hits)),
                          retrieved=len(hits), noise_doc_ids=injected)
