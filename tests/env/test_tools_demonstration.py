"""A tool registered in a test is demonstrated by the scripted teacher (Stage 1) and offered by the tokenized env,
through its hooks; a tool without them is offered to the model but never demonstrated."""

from __future__ import annotations

import pytest

from ziprl.config import EnvConfig, ZipRLConfig
from ziprl.env import SearchCompressEnv
from ziprl.env.context import Observation
from ziprl.env.demos import synthesize
from ziprl.env.scripted import ScriptedTeacher
from ziprl.env.spans import question_phrases
from ziprl.env.tools import Tool, ToolResult
from ziprl.integrations.rllib import HeuristicCandidates
from ziprl.registry import TOOLS
from ziprl.retrieval.types import QAExample
from ziprl.testing.echo_tool import Echo
from ziprl.testing.word_retriever import PASSAGES, WordRetriever

EXAMPLE = QAExample("q", "Which city is the capital of France?", ["Paris"], supporting_titles=["Paris"])


class Define(Tool):
    """``<define>word</define>``: what a newcomer's plug-in file with both hooks holds."""

    def describe(self, cfg: EnvConfig) -> str:
        return "<define>word</define> defines a word"

    def run(self, env, argument: str, written: str) -> ToolResult:
        return ToolResult(Observation(env.turn, f"define {argument}", f"{argument}: a proper noun."))

    def demonstrate(self, plan, env) -> str | None:
        """Define the question's first capitalised phrase, once, before anything else."""
        if any(tool == "define" for tool, _ in plan.played):
            return None
        return question_phrases(plan.question)[0]

    def candidates(self, env) -> list[str]:
        return question_phrases(env.example.question)


@pytest.fixture
def define(monkeypatch):
    TOOLS.names()
    monkeypatch.setitem(TOOLS._entries, "define", (-1, Define))  # asked before search


def play(env: SearchCompressEnv) -> list[str]:
    teacher, actions, done = ScriptedTeacher(), [], False
    env.reset(options={"example": EXAMPLE})
    while not done:
        *_, term, trunc, info = env.step(teacher.respond(env))
        actions.append(info["action"])
        done = term or trunc
    return actions


def env() -> SearchCompressEnv:
    return SearchCompressEnv(EnvConfig(), retriever=WordRetriever(PASSAGES), examples=[EXAMPLE])


def test_the_teacher_demonstrates_a_tool_with_a_hook(define):
    assert play(env()) == ["define", "search", "open", "answer"]
    rows, counts = synthesize(ZipRLConfig(), [EXAMPLE], WordRetriever(PASSAGES), progress=False)
    assert counts["kept"] == 1
    assert [r["action"] for r in rows] == ["define", "search", "open", "answer"]
    assert "<define>France</define>" in rows[0]["response"]


def test_the_tokenized_env_offers_its_candidates(define):
    e = env()
    e.reset(options={"example": EXAMPLE})
    actions = HeuristicCandidates(12).actions(e)
    assert actions[0] == "<define>France</define>"
    assert "<search>France</search>" in actions


def test_a_tool_without_hooks_is_never_demonstrated(monkeypatch):
    TOOLS.names()
    monkeypatch.setitem(TOOLS._entries, "echo", (-1, Echo))
    e = env()
    assert play(e) == ["search", "open", "answer"]
    assert "<echo>" in e.system
    e.reset(options={"example": EXAMPLE})
    assert not any(a.startswith("<echo>") for a in HeuristicCandidates(12).actions(e))
