"""benchmarks/learning.py: held-out questions stay out of training, and its intervals are right."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def learning():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_learning", BENCH / "learning.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_bootstrap_of_a_constant_difference_is_that_constant(learning):
    assert learning.bootstrap([[0.25] * 40]) == (0.25, 0.25, 0.25)


def test_bootstrap_interval_matches_the_normal_approximation(learning):
    """100 questions, half +1 and half -1 (mean 0, sd 1): the 95% interval is about ±1.96/10."""
    mean, lo, hi = learning.bootstrap([[1.0, -1.0] * 50], n=20_000)
    assert mean == 0.0
    assert lo == pytest.approx(-0.196, abs=0.03) and hi == pytest.approx(0.196, abs=0.03)


def test_bootstrap_pairs_seeds_on_the_same_questions(learning):
    """Two seeds whose differences cancel question by question: every resample averages to exactly 0."""
    diffs = [[0.1 * i for i in range(30)], [-0.1 * i for i in range(30)]]
    assert learning.bootstrap(diffs) == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)


def test_paired_differences_follow_question_ids(learning):
    a = {"per_question": [{"id": "q1", "f1": 0.2}, {"id": "q2", "f1": 0.5}]}
    b = {"per_question": [{"id": "q2", "f1": 1.0}, {"id": "q1", "f1": 0.0}, {"id": "q3", "f1": 1.0}]}
    assert learning.paired(a, b, "f1") == pytest.approx([-0.2, 0.5])


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data")
def test_held_out_questions_are_disjoint_from_training(learning, tmp_path):
    from ziprl.retrieval.datasets import load_qa_jsonl

    train_path, held_path, corpus = learning.split_questions(tmp_path, 100)
    train, held = load_qa_jsonl(train_path), load_qa_jsonl(held_path)
    assert len(held) == 100 and len(train) == 400
    assert [ex.id for ex in held] == [f"hotpotqa-dev-distractor-{i}" for i in range(200, 300)]
    assert not {ex.id for ex in train} & {ex.id for ex in held}
    assert not {ex.question for ex in train} & {ex.question for ex in held}
    assert corpus.is_file()
