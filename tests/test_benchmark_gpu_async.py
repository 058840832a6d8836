"""benchmarks/gpu_async.py without a GPU: bad modes and configs exit 2 before any work, a machine without CUDA is
told there is nothing to measure, a mode's row averages the steps between the first and the last, and the CPU smoke
run trains every mode (split through a local Ray cluster) and writes its results with their provenance."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

import pytest
import torch

from ziprl.testing.learner import requires_deepspeed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_async  # noqa: E402


def test_an_unknown_mode_exits_2_naming_the_choices(capsys):
    assert gpu_async.main(["--modes", "off,process"]) == 2
    assert "choose from off, thread, split" in capsys.readouterr().err


@pytest.mark.parametrize("share", ["0", "1", "1.5"])
def test_a_gpu_share_outside_0_to_1_exits_2(share, capsys):
    assert gpu_async.main(["--gpu-share", share]) == 2
    assert "between 0 and 1" in capsys.readouterr().err


def test_split_runs_one_rollout_actor_and_one_learner_rank_on_shares_of_the_gpu():
    args = argparse.Namespace(questions=8, group=8, turns=6, new_tokens=128, steps=4, gpu_share=0.25, cpu_smoke=False,
                              set=["x=1"])
    got = gpu_async.overrides(args, "split", Path("/o"))
    assert {"rollout.overlap=off", "ray.num_rollout_actors=1", "ray.learner_ranks=1", "ray.rollout_gpus=0.25",
            "ray.learner_gpus=0.75", "run.out_dir=/o/split"} <= set(got)
    assert got[-1] == "x=1"  # --set wins
    assert not [o for o in gpu_async.overrides(args, "thread", Path("/o")) if o.startswith("ray.num_rollout")]


def test_an_unknown_architecture_exits_2_naming_the_choices(capsys):
    assert gpu_async.main(["--arch", "qwen9-1t"]) == 2
    assert "qwen3-1.7b" in capsys.readouterr().err


def test_thread_without_staleness_exits_2_naming_both_keys(capsys):
    assert gpu_async.main(["--set", "ray.max_staleness=0"]) == 2
    err = capsys.readouterr().err
    assert "rollout.overlap=thread" in err
    assert "ray.max_staleness" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_without_cuda_there_is_nothing_to_measure(capsys):
    assert gpu_async.main([]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_a_row_averages_the_steps_after_the_first_and_before_the_last():
    steps = [{"perf/step_seconds": s, "learner/mfu": 0.1 * s, "system/learner_wait_frac": 0.5} for s in (9.0, 2.0, 4.0, 1.0)]
    row = gpu_async.summary("thread", steps)
    assert row == {"mode": "thread", "steps": 4, "steps_averaged": 2, "step_s": 3.0, "mfu": pytest.approx(0.3),
                   "wait_frac": 0.5}
    assert gpu_async.summary("off", steps[:2])["step_s"] == 5.5  # too few to drop any
    rows = [{"mode": "off", "step_s": 3.0}, {"mode": "thread", "step_s": 2.0}]
    gpu_async.add_speedup(rows)
    assert [r["speedup"] for r in rows] == [1.0, 1.5]


@pytest.mark.slow
@pytest.mark.ray_cluster
@requires_deepspeed
def test_the_cpu_smoke_run_trains_every_mode_and_writes_its_results(tmp_path, monkeypatch):
    """off and thread through ziprl.train; split through ziprl.launch (a local Ray cluster, the retriever on Ray Serve,
    one rollout actor, one learner rank), on the CPU with no GPU shares."""
    monkeypatch.setattr(sys.modules["_common"], "RESULTS", tmp_path)
    import ziprl.actors.launch as ray_launch
    from ziprl.loop.in_process import THREAD_NAME

    launched, launch = [], ray_launch.launch
    monkeypatch.setattr(ray_launch, "launch", lambda cfg, progress: launched.append(cfg.ray) or launch(cfg, progress))
    assert gpu_async.main(["--cpu-smoke", "--name", "smoke"]) == 0
    assert [(r.num_rollout_actors, r.learner_ranks, r.rollout_gpus, r.learner_gpus) for r in launched] == [(1, 1, 0, 0)]
    assert [t for t in threading.enumerate() if t.name == THREAD_NAME] == []
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert [r["mode"] for r in result["rows"]] == ["off", "thread", "split"]
    for row in result["rows"]:
        assert row["steps"] == 2
        assert row["step_s"] > 0
        assert row["gen_tok_s"] > 0
        assert 0 <= row["wait_frac"] <= 1
        assert "mfu" in row
        assert "speedup" in row
    assert {"commit", "command", "machine"} <= set(result)
    assert "| mode |" in (tmp_path / "smoke.md").read_text()


@pytest.mark.slow
@requires_deepspeed
def test_an_architecture_trains_from_random_weights_of_its_shape(tmp_path, monkeypatch):
    """--arch: the learner's MFU in a real ziprl.train at another model's size (qwen3-1.7b on a GPU); here the 2-layer
    shape on the CPU."""
    monkeypatch.setattr(sys.modules["_common"], "RESULTS", tmp_path)
    built, build = [], gpu_async.build_model

    def build_model(arch, tokenizer, out, device):
        built.append((arch, device))
        return build(arch, tokenizer, out, device)

    monkeypatch.setattr(gpu_async, "build_model", build_model)
    assert gpu_async.main(["--cpu-smoke", "--arch", "tiny", "--modes", "off", "--name", "arch"]) == 0
    assert built == [("tiny", "cpu")]
    result = json.loads((tmp_path / "arch.json").read_text())
    assert result["meta"]["model"] == "tiny, random init"
    assert [r["mode"] for r in result["rows"]] == ["off"]
    assert result["rows"][0]["steps"] == 2
    assert "mfu" in result["rows"][0]

