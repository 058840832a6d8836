"""``window``: the last ``env.window_size`` raw observations, no compression (the observation-masking
baseline of the context-management literature); older observations are dropped."""

from __future__ import annotations

from dataclasses import dataclass, field

from ziprl.env.context import ContextState, Observation, Strategy, render_observation
from ziprl.env.prompts import THINK_FORMAT, head
from ziprl.registry import STRATEGIES


@dataclass
class WindowContext(ContextState):
    """Question + the newest ``size`` raw observations (the pending one included)."""

    size: int = 3
    kept: list[Observation] = field(default_factory=list)  # oldest first
    dropped: int = 0

    def keep(self, turn: int, response: str, note: str | None, level: int | None, observation: Observation | None) -> None:
        if observation is not None:
            self.kept.append(observation)
            if len(self.kept) > self.size:
                self.kept.pop(0)
                self.dropped += 1

    def body(self) -> list[str]:
        parts = [f"Earlier observations (the last {self.size} are kept raw, newest last):"]
        if self.dropped:
            parts.append(f"({self.dropped} older observations dropped)")
        earlier = [o for o in self.kept if o is not self.pending]
        parts += [render_observation(o) for o in earlier] or ["(none)"]
        return parts


@STRATEGIES.register("window", order=4)
class Window(Strategy):
    def system_prompt(self) -> str:
        return head(self.cfg) + (f"You see the question and the last {self.cfg.window_size} observations in full; "
                                 "older ones are dropped.\n" + THINK_FORMAT)

    def new_context(self, question: str) -> WindowContext:
        return WindowContext(question, size=self.cfg.window_size)
