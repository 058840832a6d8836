"""``<answer>text</answer>``: ends the episode; the reward is ``env.reward`` (a registered outcome reward)."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.env.spans import answer_spans
from ziprl.env.tools import Tool, ToolResult
from ziprl.registry import REWARDS, TOOLS
from ziprl.scoring import exact_match, f1_score

MAX_CANDIDATES = 6  # answer spans the tokenized env offers per turn


@TOOLS.register("answer", order=2)
class Answer(Tool):
    terminal = True

    def describe(self, cfg: EnvConfig) -> str:
        return "<answer>short answer</answer> finishes"

    def run(self, env, argument: str, written: str) -> ToolResult:
        golds = env.example.answers
        metrics = {"em": exact_match(argument, golds), "f1": f1_score(argument, golds)}
        return ToolResult(reward=REWARDS[env.config.reward](argument, golds), metrics=metrics)

    def demonstrate(self, plan, env) -> str | None:
        """The gold answer (the teacher's last resort: reached once the titles are done, or on the last turn)."""
        return plan.answers[0]

    def candidates(self, env) -> list[str]:
        """Short spans of the pending observation and the notes, newest first (never the gold answer)."""
        ctx = env.context
        texts = ([ctx.pending.text] if ctx.pending else []) + [n.text for n in reversed(ctx.memory)]
        return answer_spans(env.example.question, texts, MAX_CANDIDATES)
