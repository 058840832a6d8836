"""``react``: the full history, every raw observation kept (the context grows with the turns)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ziprl.env.context import ContextState, Observation, Strategy, render_observation
from ziprl.env.prompts import THINK_FORMAT, head
from ziprl.env.protocol import defuse, escape
from ziprl.registry import STRATEGIES

REJECTED_KEEP = 2000  # at most this many characters of a rejected response are kept (memory stays bounded)


@dataclass
class HistoryContext(ContextState):
    """Chat history: each turn's response (defused: protocol tags kept, no template token), then the observation
    it produced, as assistant/user messages."""

    history: list[tuple[str, str]] = field(default_factory=list)  # (assistant text, user text)

    def keep(self, turn: int, response: str, note: str | None, level: int | None, observation: Observation | None) -> None:
        self.history.append((response, render_observation(observation) if observation else ""))

    def reject(self, response: str, error: str) -> None:
        super().reject(response, error)
        if len(response) > REJECTED_KEEP:
            response = f"{response[:REJECTED_KEEP]}… [{len(response) - REJECTED_KEEP} more characters cut]"
        self.history.append((response, ""))

    def messages(self, system: str, turn: int, max_turns: int) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"Question: {escape(self.question)}"}]
        for assistant, user in self.history:
            msgs.append({"role": "assistant", "content": defuse(assistant)})
            msgs.append({"role": "user", "content": user or "(no observation)"})
        footer = self.render_notice() + f"Turn {turn} of {max_turns}."
        msgs[-1] = {"role": "user", "content": msgs[-1]["content"] + "\n\n" + footer}
        return msgs


@STRATEGIES.register("react", order=2)
class React(Strategy):
    def system_prompt(self) -> str:
        return head(self.cfg) + "You see every earlier turn and observation.\n" + THINK_FORMAT

    def new_context(self, question: str) -> HistoryContext:
        return HistoryContext(question)
