"""Cold-start SFT: transition rows (loss on the response + end-of-turn only), demo-file validation, and a real
DeepSpeed run that raises the demos' likelihood."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ziprl.cli.sft import main
from ziprl.config import ModelConfig, ZipRLConfig
from ziprl.learner.batch import make_micro_batches, response_logprobs
from ziprl.learner.sft import (
    DemoFileError,
    SFTRow,
    chat_prompt_ids,
    end_of_turn_ids,
    read_demos,
    run_sft,
    sft_rows,
)
from ziprl.policy.models import load_model, load_tokenizer, resolve_model_path
from ziprl.testing.learner import requires_deepspeed

DEMOS = [
    {"messages": [{"role": "system", "content": "Search, compress, answer."},
                  {"role": "user", "content": f"Question: who directed film {i}?"}],
     "response": f'<compress level="1">Film {i} was directed by Ann Lee.</compress><answer>Ann Lee</answer>'}
    for i in range(4)
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_path(ModelConfig()))


def write_demos(path: Path, demos=DEMOS, **extra_columns) -> Path:
    table = {"messages": [json.dumps(d["messages"]) for d in demos], "response": [d["response"] for d in demos]}
    pq.write_table(pa.table({**table, **extra_columns}), path)
    return path


def test_rows_are_prompt_then_response_then_end_of_turn(tokenizer):
    (row,) = sft_rows(DEMOS[:1], tokenizer, max_seq_len=512)
    prompt = chat_prompt_ids(tokenizer, DEMOS[0]["messages"])
    assert row.response_start == len(prompt)
    assert row.input_ids[: len(prompt)] == prompt
    assert tokenizer.decode(row.input_ids[row.response_start:]) == DEMOS[0]["response"] + "<|im_end|>"
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")


def test_end_of_turn_comes_from_the_template(tokenizer):
    assert end_of_turn_ids(tokenizer) == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    original = tokenizer.chat_template
    try:
        tokenizer.chat_template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}[END]\n{% endfor %}"
                                   "{% if add_generation_prompt %}[assistant]{% endif %}")
        assert tokenizer.decode(end_of_turn_ids(tokenizer)) == "[END]"
    finally:
        tokenizer.chat_template = original


def test_long_prompts_lose_left_tokens_and_long_responses_are_skipped(tokenizer, caplog):
    long_prompt = {"messages": [{"role": "user", "content": "word " * 300}], "response": "<answer>x</answer>"}
    long_response = {"messages": [{"role": "user", "content": "q"}], "response": "word " * 300}
    with caplog.at_level(logging.WARNING):
        rows = sft_rows([long_prompt, long_response], tokenizer, max_seq_len=64)
    assert len(rows) == 1
    assert len(rows[0].input_ids) == 64
    assert "skipped 1 of 2" in caplog.text
    assert tokenizer.decode(rows[0].input_ids[rows[0].response_start:]) == "<answer>x</answer><|im_end|>"


def test_read_demos_validates_the_file(tmp_path):
    assert read_demos(write_demos(tmp_path / "ok.parquet", question=["q"] * 4))[0] == DEMOS[0]
    with pytest.raises(DemoFileError, match="does not exist"):
        read_demos(tmp_path / "missing.parquet")
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(DemoFileError, match="not a demo Parquet"):
        read_demos(tmp_path / "text.parquet")
    pq.write_table(pa.table({"messages": ["[]"]}), tmp_path / "nocol.parquet")
    with pytest.raises(DemoFileError, match="not a demo Parquet"):
        read_demos(tmp_path / "nocol.parquet")
    pq.write_table(pa.table({"messages": ["{oops"], "response": ["r"]}), tmp_path / "json.parquet")
    with pytest.raises(DemoFileError, match="row 0"):
        read_demos(tmp_path / "json.parquet")
    pq.write_table(pa.table({"messages": pa.array([], pa.string()), "response": pa.array([], pa.string())}),
                   tmp_path / "empty.parquet")
    with pytest.raises(DemoFileError, match="no rows"):
        read_demos(tmp_path / "empty.parquet")


def test_cli_rejects_a_bad_demo_file_before_loading_a_model(tmp_path, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("ziprl.policy.models.resolve_model_path", no_model)
    assert main(["--demos", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "run")]) == 2
    assert "does not exist" in capsys.readouterr().err


def mean_nll(model_dir: Path, rows: list[SFTRow]) -> float:
    """Mean negative log-likelihood of the rows' response tokens under the checkpoint in ``model_dir``."""
    from ziprl.learner.batch import TurnRow

    model = load_model(model_dir)
    turn_rows = [TurnRow(r.input_ids, r.response_start, [0.0] * (len(r.input_ids) - r.response_start), 0.0, 1.0, 0)
                 for r in rows]
    (mb,) = make_micro_batches(turn_rows, len(turn_rows), pad_id=0)
    with torch.no_grad():
        logp = response_logprobs(model, mb)
    return float(-(logp * mb.loss_mask).sum() / mb.loss_mask.sum())


@pytest.mark.slow
@requires_deepspeed
def test_run_sft_raises_the_demos_likelihood(tmp_path, tokenizer, tiny_model_dir):
    cfg = ZipRLConfig()
    cfg.model.path = str(tiny_model_dir)
    cfg.sft.epochs, cfg.sft.micro_batch, cfg.sft.lr = 3, 2, 1e-3
    out = run_sft(cfg, write_demos(tmp_path / "demos.parquet", question=["q"] * 4), tmp_path / "run")
    assert out == tmp_path / "run" / "model"
    assert (out / "config.json").is_file()
    assert any(out.glob("*.safetensors"))
    assert (out / "tokenizer.json").is_file()
    assert any((tmp_path / "run" / "tb").iterdir())
    rows = sft_rows(DEMOS, tokenizer, max_seq_len=512)
    before, after = mean_nll(tiny_model_dir, rows), mean_nll(out, rows)
    assert after < before - 0.5, (before, after)


def test_length_grouped_steps_cover_every_row_once_and_pad_little():
    import numpy as np

    from ziprl.learner.sft import length_grouped_steps

    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 1000, size=203).tolist()
    steps = length_grouped_steps(lengths, 8, np.random.default_rng(1))
    assert sorted(i for s in steps for i in s) == list(range(203))
    assert all(1 <= len(s) <= 8 for s in steps)
    padded = sum(len(s) * max(lengths[i] for i in s) for s in steps)
    shuffled = np.random.default_rng(1).permutation(203).tolist()
    plain = sum(len(s) * max(lengths[i] for i in s) for s in (shuffled[k:k + 8] for k in range(0, 203, 8)))
    assert padded < 0.8 * plain  # grouped rows pad far less than a plain shuffle
    assert steps != sorted(steps, key=lambda s: lengths[s[0]])  # the steps are not in length order
