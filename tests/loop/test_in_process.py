"""`python -m ziprl.train`: the single-process loop logs, checkpoints, and resumes onto the same path."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import requires_cpu_bf16
from ziprl.env.trajectory import load_trajectories
from ziprl.testing.learner import requires_deepspeed
from ziprl.testing.loop import TRAIN_SETS, train_cfg

pytestmark = [pytest.mark.slow, requires_deepspeed]


def test_resumed_run_continues_where_the_straight_run_goes(tiny_model_dir, tmp_path):
    from ziprl.loop.in_process import train

    straight = train(train_cfg(tiny_model_dir, tmp_path / "a", 3), progress=False)
    train(train_cfg(tiny_model_dir, tmp_path / "b", 2), progress=False)
    resumed = train(train_cfg(tiny_model_dir, tmp_path / "b", 3, resume=True), progress=False)

    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]  # the resumed run appended step 3 only
    for key in ("rollout/reward", "rollout/turns", "rollout/format_error_rate", "rollout/prompt_tokens_per_turn",
                "learner/loss", "learner/kl", "learner/zero_variance_frac", "learner/tokens"):
        assert resumed[key] == pytest.approx(straight[key]), key
    assert resumed["perf/gen_tokens_per_second"] > 0
    assert resumed["perf/weight_push_seconds"] >= 0
    # same questions, same sampling seeds, same weights -> the same step-3 trajectories
    a = load_trajectories(tmp_path / "a" / "trajectories" / "step_000003.parquet")
    b = load_trajectories(tmp_path / "b" / "trajectories" / "step_000003.parquet")
    assert [(t.question_id, [u.response_ids for u in t.turns]) for t in a] == \
        [(t.question_id, [u.response_ids for u in t.turns]) for t in b]
    assert len(a) == 4
    assert {t.policy_version for t in a} == {2}
    ckpts = tmp_path / "b" / "checkpoints"
    assert (ckpts / "latest").read_text().strip().startswith("step_3-")
    assert (tmp_path / "b" / "tb").is_dir()


def test_sigterm_stops_the_command_with_a_checkpoint_of_its_last_step_that_resumes(tiny_model_dir, tmp_path):
    """``python -m ziprl.train`` on SIGTERM (a scheduler's or Ray's stop): exit 143 with a checkpoint of the last step
    it logged (none is due: run.checkpoint_every is past the run), and ``--resume`` goes on from it."""
    out, metrics = tmp_path / "run", tmp_path / "run" / "metrics.jsonl"
    command = [sys.executable, "-m", "ziprl.train", "--sft-checkpoint", str(tiny_model_dir), "--out", str(out),
               *(a for s in [*TRAIN_SETS, "run.checkpoint_every=1000"] for a in ("--set", s))]
    proc = subprocess.Popen([*command, "--steps", "200"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))  # not an inherited SIG_IGN
    deadline = time.monotonic() + 600
    while not (metrics.is_file() and metrics.read_text().strip()):  # a step is done: the loop is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 143, output
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 200
    assert f"stopped at step {steps[-1]}: checkpoint" in output
    assert (out / "checkpoints" / "latest").read_text().strip().startswith(f"step_{steps[-1]}-")

    again = subprocess.run([*command, "--resume", "--steps", str(steps[-1] + 1)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == list(range(1, steps[-1] + 2))


@requires_cpu_bf16
def test_a_resumed_run_keeps_the_dtype_its_checkpoint_was_written_in(tiny_model_dir, tmp_path, monkeypatch):
    """learner.bf16=null is decided by measuring the GEMMs; on a loaded machine a resumed run measured otherwise and
    left the straight run's loss (CI, 2.96e-10 against 2.74e-10). The checkpoint's decision holds on resume."""
    from ziprl.learner import hardware
    from ziprl.loop.in_process import train

    answers = [True, True, False]  # the straight run, the first two steps, then what the resumed run would measure
    monkeypatch.setattr(hardware, "bf16_pays", lambda device: answers.pop(0))
    straight = train(train_cfg(tiny_model_dir, tmp_path / "a", 3), progress=False)
    train(train_cfg(tiny_model_dir, tmp_path / "b", 2), progress=False)
    resumed = train(train_cfg(tiny_model_dir, tmp_path / "b", 3, resume=True), progress=False)
    for key in ("learner/loss", "learner/kl", "learner/mismatch_abs_mean"):
        assert resumed[key] == pytest.approx(straight[key]), key
    assert answers == [False]  # the resumed run did not measure: its checkpoint decided


def test_cli_reports_config_errors(capsys):
    from ziprl.cli.train import main

    assert main(["--set", "learner.loss_norm=mean"]) == 2
    assert "learner.loss_norm" in capsys.readouterr().err


class _Built(Exception):
    """Raised by the stand-in engine factory: the run stops once the engine's config is known."""


@pytest.mark.parametrize(("dtype", "bf16", "engine_dtype"), [
    pytest.param("auto", True, "bfloat16", marks=requires_cpu_bf16), ("auto", False, "float32"),
    pytest.param("float32", True, "float32", marks=requires_cpu_bf16)])
def test_the_engine_generates_in_the_learners_dtype_under_auto(tiny_model_dir, tmp_path, monkeypatch, dtype, bf16,
                                                               engine_dtype):
    """model.dtype=auto: the engine takes the dtype the learner computes in (decided by the Trainer); an explicit
    dtype is kept."""
    import ziprl.policy
    from ziprl.loop.in_process import train

    def make_engine(model_cfg, path):
        raise _Built(model_cfg.dtype)

    monkeypatch.setattr(ziprl.policy, "make_engine", make_engine)
    cfg = train_cfg(tiny_model_dir, tmp_path, 1)
    cfg.model.dtype, cfg.learner.bf16 = dtype, bf16
    with pytest.raises(_Built) as built:
        train(cfg, progress=False)
    assert built.value.args == (engine_dtype,)
