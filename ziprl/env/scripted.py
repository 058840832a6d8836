"""A scripted teacher: searches the supporting titles, opens them, compresses extractively, answers gold; each
action comes from the registered tools' demonstration hooks (:meth:`ziprl.env.tools.Tool.demonstrate`).

Used for the demo episode, integration tests, the context-efficiency benchmark and cold-start
demonstrations. It reads the env's pending observation and example; it never sees anything a model
would not (apart from the gold answer and supporting titles it is scripted to use).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ziprl.env.context import Observation
from ziprl.env.protocol import HIT_MARK, escape
from ziprl.env.search_env import SearchCompressEnv
from ziprl.scoring.keywords import extract_keywords, sentences
from ziprl.scoring.levels import level_spec
from ziprl.scoring.metrics import normalize_answer


def relevance_level(question: str, answers: list[str], text: str) -> int:
    """Coarse-to-fine choice: more supporting content for the question -> a finer (higher) level."""
    norm = normalize_answer(text)
    if any(a and normalize_answer(a) in norm for a in answers):
        return 4
    overlap = len(extract_keywords(question) & extract_keywords(text))
    return 3 if overlap >= 3 else 2 if overlap >= 1 else 1


def rank_sentences(question: str, answers: list[str], text: str) -> tuple[list[str], list[int]]:
    """The sentences of ``text`` and their indices by relevance: answer-bearing first, then question keywords."""
    sents = sentences(text.replace("\n", " "))
    qk = extract_keywords(question)
    norm_answers = [normalize_answer(a) for a in answers if a]

    def key(i: int) -> tuple[int, int, int]:
        s = normalize_answer(sents[i])
        return (-int(any(a in s for a in norm_answers)), -len(qk & extract_keywords(sents[i])), i)

    return sents, sorted(range(len(sents)), key=key)


def select_sentences(sents: list[str], order: list[int], low: int, high: int) -> str:
    """Take sentences in ``order`` until ``low`` is reached, skipping any that would pass ``high``; text order."""
    chosen, used = [], 0
    for i in order:
        if used >= low and used + len(sents[i]) + 1 > high:
            break
        if used + len(sents[i]) + 1 <= high:
            chosen.append(i)
            used += len(sents[i]) + 1
    return " ".join(sents[i] for i in sorted(chosen))


def extractive_note(question: str, answers: list[str], text: str, low: int, high: int) -> str:
    """Sentences of ``text`` ranked by relevance (answer, then question keywords), kept in order, within high."""
    sents, order = rank_sentences(question, answers, text)
    if not sents:
        return text[:high]
    return select_sentences(sents, order, low, high)


@dataclass
class DemoPlan:
    """The scripted teacher's state in one episode, which the tools' demonstration hooks read and update."""

    question: str
    answers: list[str]
    todo: list[str]  # supporting titles still to find and read, in order
    retried: bool = False  # todo[0] was searched a second time, with the question appended
    to_open: str | None = None  # the doc id search found for the title it just finished, for open to play
    opened: set[str] = field(default_factory=set)
    played: list[tuple[str, str]] = field(default_factory=list)  # (tool, argument) of every action so far


class ScriptedTeacher:
    """Plays one episode in a SearchCompressEnv: call ``respond(env)`` after reset and after every step.

    Each turn it writes an extractive note of the pending observation, then asks the tools' demonstration hooks
    (:meth:`ziprl.env.tools.Tool.demonstrate`) in registry order and plays the first argument one returns; on the
    last turn only terminal tools are asked. The built-in hooks: ``search`` looks each supporting title up (once
    more with the question appended when no hit carries the title), ``open`` opens the best match (or the top
    hit), ``answer`` answers gold.
    """

    def __init__(self, max_titles: int = 4):
        self.max_titles = max_titles
        self.plan: DemoPlan | None = None

    def _start(self, env: SearchCompressEnv) -> None:
        ex = env.example
        self.plan = DemoPlan(ex.question, list(ex.answers),
                             list(dict.fromkeys(ex.supporting_titles))[: self.max_titles] or [ex.question])

    def _note(self, env: SearchCompressEnv, obs: Observation) -> tuple[int, str]:
        ex, scale = env.example, env.config.scoring.level_scale
        level = env.strategy.fixed_level or relevance_level(ex.question, ex.answers, obs.text)
        spec = level_spec(level, scale)
        text = obs.text.replace(f"{HIT_MARK} ", "")  # hit lines read as "[doc-id] Title"
        return level, extractive_note(ex.question, ex.answers, text, spec.char_low, spec.char_high)

    def respond(self, env: SearchCompressEnv) -> str:
        if env.turn == 0 or self.plan is None or env.example.question != self.plan.question:
            self._start(env)
        pending = env.context.pending
        if pending is None:
            level, note = 1, f"I need to find: {self.plan.question}"
        else:
            level, note = self._note(env, pending)
        return f'<compress level="{level}">{escape(note)}</compress>\n' + self._next_action(env)

    def _next_action(self, env: SearchCompressEnv) -> str:
        last_turn = env.turn >= env.config.max_turns - 1
        for name, tool in env.tools.items():
            if last_turn and not tool.terminal:
                continue
            argument = tool.demonstrate(self.plan, env)
            if argument is not None:
                self.plan.played.append((name, argument))
                return f"<{name}>{escape(argument)}</{name}>"
        raise RuntimeError(f"no tool's demonstration hook played turn {env.turn + 1} (the teacher needs a terminal "
                           "tool that always answers, as answer does)")
