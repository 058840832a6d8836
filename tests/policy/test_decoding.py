"""The decode bookkeeping both CPU engines share: stops, finish reasons and text, for any token the model emits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ziprl.config import SamplingConfig
from ziprl.policy.decoding import DecodeRows
from ziprl.policy.models import load_tokenizer


@pytest.fixture(scope="module")
def tok(default_model_dir):
    """SmolLM2's tokenizer, loaded once: the property test below draws 200 examples."""
    return load_tokenizer(default_model_dir)


def _rows(tokenizer, stop, n=1):
    return DecodeRows(tokenizer, frozenset({2}), [[1, 5]] * n, SamplingConfig(max_new_tokens=8, stop=stop))


def test_a_stop_string_inside_a_special_tokens_text_is_not_a_stop(tok):
    """Regression (found by the llamacpp property test): the tail was checked with special tokens rendered and the
    text cut without them, so "<|im_start|>" ended a row on stop "a" and generations() raised on an empty min()."""
    assert "a" in tok.decode([1])
    assert "a" not in tok.decode([1], skip_special_tokens=True)
    rows = _rows(tok, ["a"])
    assert rows.record(torch.tensor([1]), torch.zeros(1, 49152)) == [0]  # still running
    a = tok.encode("a", add_special_tokens=False)
    assert rows.record(torch.tensor(a[-1:]), torch.zeros(1, 49152)) == []
    (g,) = rows.generations()
    assert g.finish_reason == "stop"
    assert g.text.endswith("a")
    assert g.token_ids == [1, a[-1]]


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 49151), min_size=1, max_size=8),
       stop=st.sampled_from([[], ["a"], ["</search>", "\n"], ["<"], [" "]]))
def test_any_tokens_give_a_generation(tok, tokens, stop):
    """Whatever tokens a model emits (special ones included), the bookkeeping never raises, and a row stopped by a
    string has text ending right after that string."""
    rows = _rows(tok, stop)
    for t in tokens:
        if not rows.active:
            break
        rows.record(torch.tensor([t]), torch.zeros(1, 49152))
    (g,) = rows.generations()
    assert g.token_ids == tokens[: len(g.token_ids)]
    assert len(g.logprobs) == len(g.token_ids)
    if rows.stopped_by_string[0]:
        assert any(g.text.endswith(s) for s in stop)
