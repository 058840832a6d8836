"""``summary``: training-free baseline; memory holds rule-based extractive summaries instead of the model's notes."""

from __future__ import annotations

from dataclasses import dataclass

from ziprl.env.context import MemoryContext, Observation, Strategy
from ziprl.env.prompts import THINK_FORMAT, head
from ziprl.registry import STRATEGIES
from ziprl.scoring.keywords import extract_keywords, sentences
from ziprl.scoring.levels import level_spec

SUMMARY_LEVEL = 2  # the summaries' fixed budget


def rule_summary(question: str, text: str, max_chars: int) -> str:
    """Extractive summary: the sentences sharing most keywords with the question, in order, within max_chars."""
    sents = sentences(text)
    if not sents:
        return text[:max_chars]
    qk = extract_keywords(question)
    ranked = sorted(range(len(sents)), key=lambda i: (-len(qk & extract_keywords(sents[i])), i))
    chosen, used = [], 0
    for i in ranked:
        if used + len(sents[i]) + 1 > max_chars:
            continue
        chosen.append(i)
        used += len(sents[i]) + 1
    return " ".join(sents[i] for i in sorted(chosen)) or sents[ranked[0]][:max_chars]


@dataclass
class SummaryContext(MemoryContext):
    title = "Memory (automatic summaries):"

    def keep(self, turn: int, response: str, note: str | None, level: int | None, observation: Observation | None) -> None:
        if self.pending is not None:
            high = level_spec(SUMMARY_LEVEL, self.level_scale).char_high
            note, level = rule_summary(self.question, self.pending.text, high), SUMMARY_LEVEL
        super().keep(turn, response, note, level, observation)


@STRATEGIES.register("summary", order=3)
class Summary(Strategy):
    def system_prompt(self) -> str:
        return head(self.cfg) + ("You see the question, automatic summaries of earlier observations and the newest "
                                 "one.\n" + THINK_FORMAT)

    def new_context(self, question: str) -> SummaryContext:
        return SummaryContext.for_config(question, self.cfg)
