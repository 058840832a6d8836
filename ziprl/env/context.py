"""Context strategies: what the agent sees each turn (the paper's method and its baselines, one env).

- ``adaptive``/``uniform``: question + memory of earlier compressions + the one pending raw observation;
  after a well-formed turn the raw observation is dropped and the compression joins memory.
- ``react``: the full history, every raw observation kept.
- ``summary``: as adaptive, but memory holds training-free rule-based summaries.

All untrusted text (question, documents, the model's own notes) is escaped before rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ziprl.env.protocol import escape
from ziprl.scoring.keywords import extract_keywords, sentences
from ziprl.scoring.levels import level_spec

SUMMARY_LEVEL = 2  # the summary baseline's fixed budget
REJECTED_KEEP = 2000  # react keeps at most this many characters of a rejected response (memory stays bounded)


@dataclass(frozen=True)
class Observation:
    """A raw tool result waiting to be compressed; ``text`` is unescaped (the source x of Q_com)."""

    turn: int
    label: str  # e.g. 'search "who founded x"' or 'open doc-12'
    text: str


@dataclass(frozen=True)
class Note:
    turn: int
    level: int | None
    label: str
    text: str


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
class ContextState:
    """The agent's context for one episode under one strategy."""

    strategy: str
    question: str
    level_scale: float = 1.0
    memory_max_chars: int = 0  # 0 = no bound
    memory: list[Note] = field(default_factory=list)
    dropped_notes: int = 0
    pending: Observation | None = None
    notice: str | None = None
    history: list[tuple[str, str]] = field(default_factory=list)  # react: (assistant text, user text)

    def commit(self, turn: int, response: str, note: str | None, level: int | None, observation: Observation | None) -> None:
        """Apply a well-formed turn: store its note, consume the pending observation, set the next one."""
        self.notice = None
        if self.strategy == "react":
            self.history.append((response, self._render_observation(observation) if observation else ""))
        else:
            if self.strategy == "summary" and self.pending is not None:
                s = level_spec(SUMMARY_LEVEL, self.level_scale)
                note, level = rule_summary(self.question, self.pending.text, s.char_high), SUMMARY_LEVEL
            if note:
                label = self.pending.label if self.pending else "reasoning"
                self._remember(Note(turn, level, label, note))
        self.pending = observation

    def reject(self, response: str, error: str) -> None:
        """A malformed turn: nothing is applied; the pending observation stays and the error is shown."""
        self.notice = error
        if self.strategy == "react":
            if len(response) > REJECTED_KEEP:
                response = f"{response[:REJECTED_KEEP]}… [{len(response) - REJECTED_KEEP} more characters cut]"
            self.history.append((response, ""))

    def _remember(self, note: Note) -> None:
        cap = int(1.5 * level_spec(note.level or 3, self.level_scale).char_high)
        if self.memory_max_chars:
            cap = min(cap, self.memory_max_chars)
        self.memory.append(Note(note.turn, note.level, note.label, note.text[:cap]))
        if self.memory_max_chars:
            while sum(len(n.text) for n in self.memory) > self.memory_max_chars:
                self.memory.pop(0)
                self.dropped_notes += 1

    @staticmethod
    def _render_observation(obs: Observation) -> str:
        return f"OBSERVATION (turn {obs.turn}, {escape(obs.label)}):\n<observation>\n{escape(obs.text)}\n</observation>"

    def _render_notice(self) -> str:
        return f"NOTICE: your last turn was not applied: {escape(self.notice)}\n" if self.notice else ""

    def messages(self, system: str, turn: int, max_turns: int) -> list[dict[str, str]]:
        """Chat messages for the next turn (``turn`` is 1-based)."""
        footer = f"Turn {turn} of {max_turns}."
        question = f"Question: {escape(self.question)}"
        if self.strategy == "react":
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            for assistant, user in self.history:
                msgs.append({"role": "assistant", "content": assistant})
                msgs.append({"role": "user", "content": user or "(no observation)"})
            msgs[-1] = {"role": "user", "content": msgs[-1]["content"] + "\n\n" + self._render_notice() + footer}
            return msgs
        parts = [question, ""]
        title = "Memory (your notes so far):" if self.strategy != "summary" else "Memory (automatic summaries):"
        parts.append(title)
        if self.dropped_notes:
            parts.append(f"({self.dropped_notes} older notes dropped to fit the memory budget)")
        for n in self.memory:
            lvl = f"level {n.level}" if n.level else "no level"
            parts.append(f"- [turn {n.turn}, {lvl}, {escape(n.label)}] {escape(n.text)}")
        if not self.memory:
            parts.append("(empty)")
        parts.append("")
        if self.pending is not None:
            parts += [self._render_observation(self.pending), ""]
        else:
            parts += ["No observation yet: start by searching.", ""]
        parts.append(self._render_notice() + footer)
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]
