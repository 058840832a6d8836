"""``<answer>text</answer>``: ends the episode; the reward is ``env.reward`` (a registered outcome reward)."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.env.tools import Tool, ToolResult
from ziprl.registry import REWARDS, TOOLS
from ziprl.scoring import exact_match, f1_score


@TOOLS.register("answer", order=2)
class Answer(Tool):
    terminal = True

    def describe(self, cfg: EnvConfig) -> str:
        return "<answer>short answer</answer> finishes"

    def run(self, env, argument: str, written: str) -> ToolResult:
        golds = env.example.answers
        metrics = {"em": exact_match(argument, golds), "f1": f1_score(argument, golds)}
        return ToolResult(reward=REWARDS[env.config.reward](argument, golds), metrics=metrics)
