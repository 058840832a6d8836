"""What the agent sees each turn: the base classes of context strategies (one plug-in file each in
``ziprl/env/strategies/``).

A :class:`Strategy` (bound to an :class:`EnvConfig`) decides the system prompt, whether every turn owes a
``<compress>`` block, whether levels are fixed, and which :class:`ContextState` an episode keeps.
:class:`MemoryContext` is the paper's layout: question + memory of earlier notes + the one pending raw
observation; after a well-formed turn the raw observation is dropped and the note joins memory.

All untrusted text (question, documents, the model's own notes) is escaped before rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ziprl.config import EnvConfig
from ziprl.env.protocol import escape, escape_observation
from ziprl.scoring.levels import level_spec


@dataclass(frozen=True)
class Observation:
    """A raw tool result waiting to be compressed; ``text`` is unescaped (the source x of Q_com)."""

    turn: int
    label: str  # e.g. 'search "who founded x"' or 'open doc-12'
    text: str
    tool: str = ""  # the tool that returned it (the env sets it)


@dataclass(frozen=True)
class Note:
    turn: int
    level: int | None
    label: str
    text: str


def render_observation(obs: Observation) -> str:
    """An observation as the agent sees it (label and text escaped, the text's hit markers kept)."""
    return (f"OBSERVATION (turn {obs.turn}, {escape(obs.label)}):\n<observation>\n{escape_observation(obs.text)}\n"
            "</observation>")


@dataclass
class ContextState:
    """The agent's context for one episode; a strategy's subclass decides what is kept and how it is shown."""

    question: str
    pending: Observation | None = None
    notice: str | None = None
    memory: list[Note] = field(default_factory=list)  # notes shown to the agent (empty for strategies without notes)

    def commit(self, turn: int, response: str, note: str | None, level: int | None, observation: Observation | None) -> None:
        """Apply a well-formed turn: keep what the strategy keeps, consume the pending observation, set the next one."""
        self.notice = None
        self.keep(turn, response, note, level, observation)
        self.pending = observation

    def keep(self, turn: int, response: str, note: str | None, level: int | None, observation: Observation | None) -> None:
        """What the strategy keeps of a well-formed turn (called before ``pending`` becomes ``observation``)."""

    def reject(self, response: str, error: str) -> None:
        """A malformed turn: nothing is applied; the pending observation stays and the error is shown."""
        self.notice = error

    def render_notice(self) -> str:
        return f"NOTICE: your last turn was not applied: {escape(self.notice)}\n" if self.notice else ""

    def body(self) -> list[str]:
        """Lines between the question and the pending observation (memory, earlier observations, ...)."""
        return []

    def messages(self, system: str, turn: int, max_turns: int) -> list[dict[str, str]]:
        """Chat messages for the next turn (``turn`` is 1-based): one user message with the whole context."""
        parts = [f"Question: {escape(self.question)}", "", *self.body(), ""]
        if self.pending is not None:
            parts += [render_observation(self.pending), ""]
        else:
            parts += ["No observation yet: start by searching.", ""]
        parts.append(self.render_notice() + f"Turn {turn} of {max_turns}.")
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


@dataclass
class MemoryContext(ContextState):
    """Question + memory of notes (newest that fit ``memory_max_chars``) + the one pending raw observation."""

    level_scale: float = 1.0
    memory_max_chars: int = 0  # 0 = no bound
    dropped_notes: int = 0
    title = "Memory (your notes so far):"

    @classmethod
    def for_config(cls, question: str, cfg: EnvConfig) -> MemoryContext:
        """``env.memory_max_chars`` None means twice level 5's (scaled) upper bound."""
        budget = cfg.memory_max_chars
        if budget is None:
            budget = 2 * level_spec(5, cfg.scoring.level_scale).char_high
        return cls(question, level_scale=cfg.scoring.level_scale, memory_max_chars=budget)

    def keep(self, turn: int, response: str, note: str | None, level: int | None, observation: Observation | None) -> None:
        if note:
            self.remember(Note(turn, level, self.pending.label if self.pending else "reasoning", note))

    def remember(self, note: Note) -> None:
        cap = int(1.5 * level_spec(note.level or 3, self.level_scale).char_high)
        if self.memory_max_chars:
            cap = min(cap, self.memory_max_chars)
        self.memory.append(Note(note.turn, note.level, note.label, note.text[:cap]))
        if self.memory_max_chars:
            while sum(len(n.text) for n in self.memory) > self.memory_max_chars:
                self.memory.pop(0)
                self.dropped_notes += 1

    def body(self) -> list[str]:
        parts = [self.title]
        if self.dropped_notes:
            parts.append(f"({self.dropped_notes} older notes dropped to fit the memory budget)")
        for n in self.memory:
            lvl = f"level {n.level}" if n.level else "no level"
            parts.append(f"- [turn {n.turn}, {lvl}, {escape(n.label)}] {escape(n.text)}")
        if not self.memory:
            parts.append("(empty)")
        return parts


class Strategy:
    """A context strategy bound to an env config; subclasses register with ``@STRATEGIES.register(name)``."""

    compresses = False  # every turn owes a <compress> block, scored (Q_com) against the pending observation

    def __init__(self, cfg: EnvConfig):
        self.cfg = cfg

    @property
    def fixed_level(self) -> int | None:
        """The level every note gets, whatever the agent writes; None = the agent chooses."""
        return None

    def level(self, chosen: int | None) -> int | None:
        """The level a turn's note is scored and stored at."""
        return chosen if self.fixed_level is None else self.fixed_level

    def system_prompt(self) -> str:
        raise NotImplementedError

    def new_context(self, question: str) -> ContextState:
        raise NotImplementedError
