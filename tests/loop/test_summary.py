"""The end-of-run summary of ``ziprl.train`` and ``ziprl.launch`` (ziprl/loop/summary.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ziprl.config import load_config
from ziprl.loop.summary import (
    RunFacts,
    config_arguments,
    next_commands,
    run_arguments,
    run_summary,
    step_rows,
    trend,
    what_ran,
)


def row(step: int, reward: float, errors: float = 0.5, q_com: float = 0.4) -> dict[str, float]:
    return {"step": step, "rollout/reward": reward, "rollout/format_error_rate": errors, "rollout/q_com": q_com,
            "perf/step_seconds": 30.0}


FACTS = RunFacts("ziprl.launch", "Stage 1 (scripted demos + SFT), then 2 GRPO steps", 2, "runs/default",
                 "/cache/stage1/model", "runs/default/checkpoints/step_2-ab12cd34",
                 ("--config", "configs/laptop.yaml", "--set", "model.path=/models/x", "--set", "env.max_turns=4"),
                 ("--out", "runs/default"))


def commands(facts: RunFacts = FACTS) -> dict[str, list[str]]:
    return {what: shlex.split(cmd) for what, cmd in next_commands(facts)}


def test_step_rows_keep_each_steps_last_row_in_step_order():
    lines = [json.dumps(row(2, 0.1)), "", json.dumps(row(1, 0.0)), json.dumps(row(2, 0.3))]
    rows = step_rows(lines)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["rollout/reward"] == 0.3


def test_trend_shows_every_step_up_to_eight():
    assert trend([0.0, 0.125, 0.5]) == "0.00 → 0.12 → 0.50"
    assert trend([]) == "not logged"


def test_trend_of_a_long_run_gives_the_ends_and_the_quarters_means():
    values = [0.0] * 4 + [0.5] * 8 + [1.0] * 4
    assert trend(values) == "0.00 → 1.00 (mean of the first 4 steps 0.00, of the last 4 1.00)"


def test_the_summary_names_the_run_its_trends_and_outputs():
    text = run_summary(FACTS, [row(1, 0.0, 0.75, 0.5), row(2, 0.25, 0.55, 0.6)])
    lines = text.splitlines()
    assert lines[0].startswith("── ziprl.launch: done")
    assert "ran:    Stage 1 (scripted demos + SFT), then 2 GRPO steps" in lines
    assert "steps:  2 of 2 (60 s of RL steps)" in lines
    assert "  reward                  0.00 → 0.25" in lines
    assert "  format errors / turn    0.75 → 0.55" in lines
    assert "  Q_com                   0.50 → 0.60" in lines
    assert "  TensorBoard             tensorboard --logdir runs/default/tb" in lines
    assert "  checkpoints             runs/default/checkpoints/step_2-ab12cd34" in lines
    assert "  trajectories            runs/default/trajectories/step_*.parquet" in lines


def test_next_commands_view_export_evaluate_and_resume_with_the_runs_configuration():
    cmds = commands()
    assert cmds["view the trajectories"] == ["python", "-m", "ziprl.view", "runs/default"]
    assert cmds["evaluate it"] == ["python", "-m", "ziprl.eval", "--model", "runs/default-step2-model",
                                   "--out", "runs/default-step2-eval", "--config", "configs/laptop.yaml", "--set", "env.max_turns=4"]
    assert cmds["train longer"] == ["python", "-m", "ziprl.launch", "--out", "runs/default", "--config",
                                    "configs/laptop.yaml", "--set", "model.path=/models/x", "--set", "env.max_turns=4",
                                    "--resume", "--steps", "4"]


def test_the_export_command_is_python_naming_the_checkpoint_base_model_and_destination(monkeypatch):
    exported = []
    monkeypatch.setattr("ziprl.learner.checkpoint.export_model", lambda *a: exported.append(a))
    argv = commands()["export the policy"]
    assert argv[:2] == ["python", "-c"]
    exec(compile(argv[2], "<summary>", "exec"), {})  # the command the summary prints
    assert exported == [("runs/default/checkpoints/step_2-ab12cd34", "/cache/stage1/model", "runs/default-step2-model")]


def test_paths_with_spaces_and_quotes_survive_the_shell():
    facts = RunFacts("ziprl.train", "x", 3, "my runs/it's", "/m", "my runs/it's/checkpoints/step_3", (), ())
    assert commands(facts)["view the trajectories"][-1] == "my runs/it's"
    assert commands(facts)["train longer"][-2:] == ["--steps", "6"]


def test_without_a_checkpoint_only_viewing_is_offered():
    facts = RunFacts("ziprl.train", "x", 2, "run", "/m", None, (), ("--out", "run"))
    assert list(commands(facts)) == ["view the trajectories"]
    assert "  checkpoints             none written" in run_summary(facts, []).splitlines()
    assert "  reward                  not logged" in run_summary(facts, []).splitlines()


def test_what_ran_on_the_embedded_defaults():
    cfg = load_config(None, [])
    assert what_ran(cfg, stage1=True) == (
        "Stage 1 (scripted demos + SFT), then 2 GRPO + HRR (w = 0.2) steps of 1 question(s) x G = 2 on 'sample' "
        "(adaptive strategy); model: the embedded SmolLM2-135M-Instruct")
    plain = load_config(None, ["learner.hrr_weight=0", "run.sft_checkpoint=/sft"])
    assert what_ran(plain, stage1=False).startswith("from /sft: 2 GRPO steps")
    rloo = load_config(None, ["learner.advantage_estimator=rloo"])
    assert what_ran(rloo, stage1=False).startswith("from the base model: 2 rloo + HRR (w = 0.2) steps")
    causal = load_config(None, ["learner.advantage_estimator=rloo", "learner.hrr_reference=causal"])
    assert what_ran(causal, stage1=False).startswith("from the base model: 2 rloo + HRR (w = 0.2, causal Q_bar) steps")


def test_arguments_that_rebuild_the_run():
    assert config_arguments("c.yaml", ["a.b=1"]) == ("--config", "c.yaml", "--set", "a.b=1")
    assert config_arguments(None, []) == ()
    assert run_arguments("/nowhere/run", {"--address": None, "--num-rollout-actors": 4}) == (
        "--out", "/nowhere/run", "--num-rollout-actors", "4")


def test_train_prints_the_summary_when_the_run_ends(tmp_path, monkeypatch, capsys):
    from ziprl.cli import train as command

    def fake_train(cfg):
        out = Path(cfg.run.out_dir)
        (out / "metrics.jsonl").write_text("".join(json.dumps(row(k, 0.1 * k)) + "\n" for k in (1, 2)))
        ckpt = out / "checkpoints" / "step_2-ab12cd34"
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text("{}")
        (out / "checkpoints" / "latest").write_text(ckpt.name)
        return {}

    monkeypatch.setattr(command, "train", fake_train)
    monkeypatch.setattr(command, "check_inputs", lambda cfg, deleted=(): None)
    monkeypatch.chdir(tmp_path)
    assert command.main(["--out", "run", "--sft-checkpoint", "sft", "--set", "env.max_turns=4"]) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())  # what the run was trained with
    assert (config["env"]["max_turns"], config["run"]["sft_checkpoint"]) == (4, "sft")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("── ziprl.train: done")
    assert "  reward                  0.10 → 0.20" in lines
    assert "  checkpoints             run/checkpoints/step_2-ab12cd34" in lines
    assert lines[-1].split(None, 2)[2] == ("python -m ziprl.train --out run --sft-checkpoint sft --set "
                                           "env.max_turns=4 --resume --steps 4")
