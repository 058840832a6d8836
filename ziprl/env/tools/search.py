"""``<search>query</search>``: the top ``env.top_k`` passages (optionally noised, ``env.retrieval_noise``)."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.env.context import Observation
from ziprl.env.protocol import format_hits, parse_hits
from ziprl.env.spans import question_phrases
from ziprl.env.tools import Tool, ToolResult, seen_labels
from ziprl.registry import TOOLS
from ziprl.retrieval.noise import inject_noise


def label(query: str) -> str:
    return f'search "{query[:200]}"'


@TOOLS.register("search", order=0)
class Search(Tool):
    stats_key = "searches"

    def describe(self, cfg: EnvConfig) -> str:
        return f"<search>query</search> returns the top {cfg.top_k} passages as [doc-id] title + snippet"

    def run(self, env, argument: str, written: str) -> ToolResult:
        c = env.config
        hits, injected = inject_noise(env.retriever.search([argument], c.top_k)[0], c.retrieval_noise,
                                      env.retriever, env.noise)
        return ToolResult(Observation(env.turn, label(argument), format_hits(hits)),
                          retrieved=len(hits), noise_doc_ids=injected)

    def demonstrate(self, plan, env) -> str | None:
        """Search each supporting title in turn; when the results lack it, once more with the question appended;
        then hand the matching hit (or the top one) to ``open`` through ``plan.to_open``."""
        if not plan.todo:
            return None
        pending = env.context.pending
        if pending is not None and pending.tool == "search":  # the results for plan.todo[0]
            target, hits = plan.todo[0], parse_hits(pending.text)
            match = next((doc for doc, title in hits if title.strip().lower() == target.lower()), None)
            if match is None and not plan.retried:
                plan.retried = True
                return f"{target} {plan.question}"
            plan.todo.pop(0)
            plan.retried = False
            found = match or (hits[0][0] if hits else None)
            if found and found not in plan.opened:
                plan.to_open = found
                return None
        return plan.todo[0] if plan.todo else None

    def candidates(self, env) -> list[str]:
        """The question and each of its capitalised phrases, not searched yet."""
        question, seen = env.example.question, seen_labels(env)
        queries = dict.fromkeys(" ".join(q.split()) for q in [question, *question_phrases(question)])
        return [q for q in queries if label(q) not in seen]
