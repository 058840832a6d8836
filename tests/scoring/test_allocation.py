"""Allocation math of the Theorem-1 benchmark: equal mean budgets, and the retained-information measures."""

from __future__ import annotations

import math

import pytest

from ziprl.env.scripted import extractive_note, relevance_level
from ziprl.retrieval.corpus import load_corpus
from ziprl.retrieval.datasets import corpus_for
from ziprl.scoring import level_spec
from ziprl.scoring.allocation import (
    answer_present,
    budget_gap,
    match_budget,
    mean_budget,
    memory_q_info,
    per_kchar,
    support_recall,
)
from ziprl.testing.word_retriever import PASSAGES


def test_mean_budget_and_gap():
    assert mean_budget([100, 200, 600]) == 300
    assert mean_budget([]) == 0.0
    assert budget_gap(303, 300) == pytest.approx(0.01)
    assert budget_gap(0, 0) == 0.0
    assert budget_gap(1, 0) == 1.0


def test_match_budget_continuous_and_step_functions():
    t, got = match_budget(lambda x: 50.0 * x, 123.0, 0.0, 10.0, iters=40)
    assert t == pytest.approx(123 / 50, rel=1e-9)
    assert got == pytest.approx(123.0)
    steps = lambda x: 100.0 * math.floor(x)  # noqa: E731  (sentence-granular budgets move in steps)
    t, got = match_budget(steps, 260.0, 0.0, 10.0)
    assert got == 300.0
    assert 3 <= t < 4  # the closest reachable step, not the one below
    with pytest.raises(ValueError, match="outside the reachable budgets"):
        match_budget(steps, 5000.0, 0.0, 10.0)


def test_uniform_matched_to_adaptive_has_the_same_mean_characters():
    """The benchmark's construction on real passages: adaptive levels per passage, one bisected uniform range."""
    question, answers = "Were Scott Derrickson and Ed Wood of the same nationality?", ["American"]
    texts = [p.text for p in PASSAGES] + [p.text for p in load_corpus(corpus_for("sample"))[:40]]

    def notes(level_of, scale: float) -> list[str]:
        out = []
        for text in texts:
            spec = level_spec(level_of(text), scale)
            out.append(extractive_note(question, answers, text, spec.char_low, spec.char_high))
        return out

    levels = [relevance_level(question, answers, t) for t in texts]
    assert len(set(levels)) > 1  # a real non-uniform allocation (Theorem 1: P(f(R) != alpha_bar) > 0)
    adaptive = mean_budget([len(n) for n in notes(lambda t: relevance_level(question, answers, t), 0.3)])
    t, uniform = match_budget(lambda x: mean_budget([len(n) for n in notes(lambda _: 3, x)]), adaptive, 1e-3, 10.0,
                              iters=20)
    assert budget_gap(uniform, adaptive) < 0.02
    assert mean_budget([len(n) for n in notes(lambda _: 3, t)]) == uniform


def test_retained_information_measures():
    memory = "Scott Derrickson is an American director, He lives in Los Angeles"
    assert answer_present(memory, ["an american"]) == 1.0
    assert answer_present(memory, ["Ameri"]) == 0.0
    assert answer_present(memory, ["", "the"]) == 0.0  # nothing left after normalisation matches nothing
    support = ["Scott Derrickson is an American director.", "He lives in Los Angeles.", "He was born in 1966."]
    assert support_recall(memory, support) == pytest.approx(2 / 3)
    assert support_recall(memory, []) == 0.0
    pool = "Scott Derrickson is an American director. He lives in Los Angeles. He made Sinister."
    full, part = memory_q_info("Who is Scott Derrickson?", pool, pool), memory_q_info("Who is Scott Derrickson?", pool, memory)
    assert 0 < part < full <= 1.0
    assert memory_q_info("Who?", pool, "") == 0.0
    assert per_kchar(0.5, 250.0) == 2.0
    assert per_kchar(1.0, 0.0) == 0.0
