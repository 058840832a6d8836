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
    is_sft_entry,
    read_demos,
    run_sft,
    sft_rows,
)
from ziprl.policy.models import load_model, load_tokenizer, resolve_model_path
from ziprl.testing.learner import requires_deepspeed
from ziprl.testing.stops import stop_after

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


def test_cli_refuses_demos_that_fit_no_row_before_claiming_the_run_dir(tmp_path, monkeypatch, capsys,
                                                                        default_model_dir):
    """Tokenizing (seconds, no model loads) comes first: the rerun with a larger sft.max_seq_len is not refused as
    a directory that is not empty."""
    monkeypatch.setattr("ziprl.learner.trainer.Trainer.__init__", lambda *a, **k: pytest.fail("a model was loaded"))
    demos, out = write_demos(tmp_path / "demos.parquet"), tmp_path / "run"
    assert main(["--demos", str(demos), "--out", str(out), "--set", "sft.max_seq_len=8"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert f"no transition of {demos} fits sft.max_seq_len=8; raise sft.max_seq_len" in err
    assert not out.exists()


def test_run_sft_takes_the_rows_computed_beforehand(tmp_path, monkeypatch):
    from ziprl.outputs import OutputError

    monkeypatch.setattr("ziprl.learner.sft.demo_rows", lambda *a, **k: pytest.fail("the demos were tokenized again"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model").write_text("not an SFT run's")
    with pytest.raises(OutputError, match="already holds"):  # the next thing it does: its out_dir is checked
        run_sft(ZipRLConfig(), write_demos(tmp_path / "demos.parquet"), tmp_path / "run", rows=[SFTRow([1, 2], 1)])


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


def sft_cfg(model_dir: Path, epochs: int = 2) -> ZipRLConfig:
    cfg = ZipRLConfig()
    cfg.model.path = str(model_dir)
    cfg.sft.epochs, cfg.sft.micro_batch, cfg.sft.lr, cfg.sft.checkpoint_every = epochs, 2, 1e-3, 0
    cfg.learner.bf16 = False  # not measured per run: the runs compared compute alike
    return cfg


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.slow
@requires_deepspeed
def test_a_stopped_sft_resumes_to_the_model_a_straight_run_trains(tmp_path, tiny_model_dir):
    """Stopped after step 3 of 4 (a SIGTERM's Stop), the SFT writes a checkpoint and no model; resumed, it trains the
    same weights as the run that was not stopped, and removes its checkpoints. Other demos or another step order are
    refused before any model loads."""
    from ziprl.learner.checkpoint import CheckpointError, latest_checkpoint
    from ziprl.learner.sft import check_sft_resume, sft_order
    from ziprl.loop.stop import Stop

    demos = write_demos(tmp_path / "demos.parquet")
    straight = run_sft(sft_cfg(tiny_model_dir), demos, tmp_path / "a")
    with pytest.raises(Stop):
        run_sft(sft_cfg(tiny_model_dir), demos, tmp_path / "b", stop=stop_after(3))
    state = json.loads((latest_checkpoint(tmp_path / "b") / "state.json").read_text())
    assert state["data_position"]["steps_done"] == 3 and state["step"] == 3
    assert not (tmp_path / "b" / "model").exists()

    tokenizer = load_tokenizer(tiny_model_dir)
    rows = sft_rows(read_demos(demos), tokenizer, 1024)
    with pytest.raises(CheckpointError, match="demonstration rows"):
        check_sft_resume(tmp_path / "b", sft_order(sft_cfg(tiny_model_dir), rows[:3]))
    with pytest.raises(CheckpointError, match="epochs 2 then, 3 now"):
        check_sft_resume(tmp_path / "b", sft_order(sft_cfg(tiny_model_dir, epochs=3), rows))
    (tmp_path / "b" / "model").mkdir()  # killed after its model was written: a resume would write over it
    (tmp_path / "b" / "model" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="holds the model of a finished SFT .*pass --overwrite to train again"):
        check_sft_resume(tmp_path / "b", sft_order(sft_cfg(tiny_model_dir), rows))
    (tmp_path / "b" / "model" / "notes.txt").unlink()
    (tmp_path / "b" / "model").rmdir()
    (tmp_path / "b" / ".model.ab_c1234.tmp").mkdir()  # a model write a kill cut short: removed by the resume
    (tmp_path / "b" / ".model.ab_c1234.tmp" / "config.json").write_text("{}")

    resumed = run_sft(sft_cfg(tiny_model_dir), demos, tmp_path / "b", resume=True)
    assert not (tmp_path / "b" / ".model.ab_c1234.tmp").exists()
    a, b = weights(straight), weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "b" / "checkpoints").exists()
    base = weights(tiny_model_dir)
    assert any(not torch.equal(a[k], base[k].to(a[k].dtype)) for k in a.keys() & base.keys())  # it trained


@pytest.mark.slow
@requires_deepspeed
def test_sft_checkpoints_every_k_steps_and_a_second_signal_writes_none(tmp_path, tiny_model_dir):
    from ziprl.learner.checkpoint import latest_checkpoint
    from ziprl.loop.stop import Stop

    demos = write_demos(tmp_path / "demos.parquet")
    cfg = sft_cfg(tiny_model_dir)
    cfg.sft.checkpoint_every = 2
    with pytest.raises(Stop):  # the stop of a second signal, after step 3: the step-2 checkpoint stays the latest
        run_sft(cfg, demos, tmp_path / "b", stop=stop_after(3, checkpoint=False))
    ckpt = latest_checkpoint(tmp_path / "b")
    assert json.loads((ckpt / "state.json").read_text())["data_position"]["steps_done"] == 2
    assert [p.name for p in (tmp_path / "b" / "checkpoints").iterdir() if p.is_dir()] == [ckpt.name]


@pytest.mark.slow
@requires_deepspeed
def test_sigterm_stops_the_sft_command_with_a_checkpoint_that_resumes(tmp_path, tiny_model_dir):
    """``python -m ziprl.sft`` on SIGTERM: exit 143 with a checkpoint of its last step; ``--resume`` finishes the model
    and removes the checkpoints; ``--resume`` with other settings is one error, exit 2, nothing touched."""
    import signal
    import subprocess
    import sys
    import time

    demos, out = write_demos(tmp_path / "demos.parquet"), tmp_path / "sft"
    command = [sys.executable, "-m", "ziprl.sft", "--demos", str(demos), "--out", str(out),
               *(a for s in (f"model.path={tiny_model_dir}", "sft.micro_batch=1", "sft.epochs=100",
                             "sft.checkpoint_every=1") for a in ("--set", s))]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))  # not an inherited SIG_IGN
    deadline = time.monotonic() + 600
    while not (out / "checkpoints" / "latest").is_file():  # a step is done
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 143, output
    assert "[sft] stopped after step" in output and not (out / "model").exists()
    done = int(output.split("[sft] stopped after step ")[1].split()[0])
    assert 1 <= done < 400

    other = subprocess.run([*command, "--resume", "--set", "sft.epochs=99"], capture_output=True, text=True)
    assert other.returncode == 2 and "epochs 100 then, 99 now" in other.stderr, other.stderr
    assert (out / "checkpoints" / "latest").is_file()
    again = subprocess.run([*command, "--resume", "--set", "sft.checkpoint_every=0"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (out / "model" / "config.json").is_file() and not (out / "checkpoints").exists()


@pytest.mark.parametrize("rel", ["model/config.json", "model/modeling_tiny.py", "model/qwen.tiktoken",
                                 "model/spiece.model", "model/tekken.json", "model/model-00001-of-00002.safetensors",
                                 "model/additional_chat_templates/tool_use.jinja", "tb/events.out.tfevents.1.h.2.0",
                                 "checkpoints/step_3-0a1b2c3d/state.json", ".model.k2j_h4xz/config.json"])
def test_overwrite_may_replace_what_an_sft_run_writes_for_any_model_family(rel):
    """save_pretrained writes model/ whole, with file names of the model's family (a remote-code model's own .py)."""
    assert is_sft_entry(rel)


@pytest.mark.parametrize("rel", ["model/sub/x", "notes.txt", "checkpoints/mine.txt", "tb/mine/x"])
def test_overwrite_refuses_what_an_sft_run_does_not_write(rel):
    assert not is_sft_entry(rel)
