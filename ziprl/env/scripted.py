"""A scripted teacher: searches the supporting titles, opens them, compresses extractively, answers gold.

Used for the demo episode, integration tests, the context-efficiency benchmark and cold-start
demonstrations. It reads the env's pending observation and example; it never sees anything a model
would not (apart from the gold answer and supporting titles it is scripted to use).
"""

from __future__ import annotations

from ziprl.env.context import Observation
from ziprl.env.protocol import HIT_MARK, escape, parse_hits
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


class ScriptedTeacher:
    """Plays one episode in a SearchCompressEnv: call ``respond(env)`` after reset and after every step.

    For each supporting title it searches the title; if no hit carries that title it searches once more
    with the question appended, then opens the best match (or the top hit).
    """

    def __init__(self, max_titles: int = 4):
        self.max_titles = max_titles
        self._todo: list[str] = []
        self._retried = False
        self._opened: set[str] = set()
        self._question = ""

    def _start(self, env: SearchCompressEnv) -> None:
        ex = env.example
        self._question = ex.question
        self._todo = list(dict.fromkeys(ex.supporting_titles))[: self.max_titles] or [ex.question]
        self._retried = False
        self._opened = set()

    def _note(self, env: SearchCompressEnv, obs: Observation) -> tuple[int, str]:
        ex, scale = env.example, env.config.scoring.level_scale
        level = env.strategy.fixed_level or relevance_level(ex.question, ex.answers, obs.text)
        spec = level_spec(level, scale)
        text = obs.text.replace(f"{HIT_MARK} ", "")  # hit lines read as "[doc-id] Title"
        return level, extractive_note(ex.question, ex.answers, text, spec.char_low, spec.char_high)

    def respond(self, env: SearchCompressEnv) -> str:
        if env.turn == 0 or env.example.question != self._question:
            self._start(env)
        pending = env.context.pending
        if pending is None:
            level, note = 1, f"I need to find: {self._question}"
        else:
            level, note = self._note(env, pending)
        return f'<compress level="{level}">{escape(note)}</compress>\n' + self._next_action(env, pending)

    def _next_action(self, env: SearchCompressEnv, pending: Observation | None) -> str:
        last_turn = env.turn >= env.config.max_turns - 1
        if pending is not None and pending.label.startswith("search") and self._todo and not last_turn:
            target = self._todo[0]
            hits = parse_hits(pending.text)
            match = next((doc for doc, title in hits if title.strip().lower() == target.lower()), None)
            if match is None and not self._retried:
                self._retried = True
                return f"<search>{escape(target)} {escape(self._question)}</search>"
            self._todo.pop(0)
            self._retried = False
            match = match or (hits[0][0] if hits else None)
            if match and match not in self._opened:
                self._opened.add(match)
                return f"<open>{escape(match)}</open>"
        if self._todo and not last_turn:
            return f"<search>{escape(self._todo[0])}</search>"
        return f"<answer>{escape(env.example.answers[0])}</answer>"
