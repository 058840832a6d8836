"""Ray integration: launch on a local 2-CPU cluster, 2 rollout actors, 2 learner steps, one actor killed."""

from __future__ import annotations

import json
import signal
import threading
import time

import psutil
import pytest
import ray

from ziprl.config import ModelConfig, load_config

pytestmark = pytest.mark.slow


def _kill_rollout_actor_mid_batch(done: threading.Event, killed: list) -> None:
    """SIGKILL a rollout actor's process while it is executing ``run_batch`` (Ray titles it so): a crash."""
    deadline = time.time() + 600
    while time.time() < deadline and not done.is_set():
        for proc in psutil.process_iter(["cmdline"]):
            if any("RolloutWorker.run_batch" in part for part in proc.info["cmdline"] or []):
                time.sleep(1.0)  # let it get into generation
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    continue
                killed.append(proc.pid)
                return
        time.sleep(0.2)


def test_launch_two_actors_two_steps_survives_actor_kill(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ziprl.actors.launch import launch
    from ziprl.policy import resolve_model_path

    out = tmp_path / "run"
    cfg = load_config(None, [
        f"run.out_dir={out}", f"run.sft_checkpoint={resolve_model_path(ModelConfig())}",
        "ray.num_rollout_actors=2", "learner.steps=2", "learner.global_batch_questions=1", "learner.beta=0",
        "rollout.batch_questions=1", "rollout.group_size=2", "env.max_turns=3", "sampling.max_new_tokens=40",
        "ray.max_staleness=2", "ray.learner_cpus=0.5", "ray.retriever_cpus=0.25",
    ])
    ray.init(num_cpus=2, include_dashboard=False)
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_rollout_actor_mid_batch, args=(done, killed), daemon=True)
    killer.start()
    try:
        metrics = launch(cfg, progress=False)
    finally:
        done.set()
        killer.join(timeout=5)
    assert not ray.is_initialized()  # launch shut the cluster down cleanly
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert killed, "the test killed a rollout actor mid-run"
    assert metrics["system/groups_trained"] == 2.0
    assert lines[-1]["system/rollout_failures"] >= 1.0  # its in-flight batch was discarded and re-dispatched
    assert metrics["system/groups_dropped_stale"] == 0.0
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("rollout/reward", "rollout/em", "rollout/f1", "rollout/q_com", "rollout/q_ratio", "rollout/q_info",
                "rollout/level_3_frac", "rollout/turns", "rollout/searches", "rollout/opens", "rollout/finish_rate",
                "rollout/prompt_tokens_per_turn", "learner/loss", "learner/clip_frac", "learner/grad_norm",
                "learner/adv_mean", "learner/hrr_abs_mean", "perf/gen_tokens_per_second", "perf/weight_push_seconds",
                "system/staleness", "system/queue_depth", "system/rollout_failures"):
        assert tag in tags, tag
    for x in lines:  # a step with a gradient reports its forward's entropy; a zero-gradient step ran no forward
        assert ("learner/entropy" in x) != (x.get("learner/zero_gradient") == 1.0), x
    assert [e.step for e in acc.Scalars("learner/loss")] == [1, 2]
    assert (out / "checkpoints").is_dir() and len(list((out / "trajectories").glob("*.parquet"))) == 2


def test_launch_batch_larger_than_actors_on_policy(tmp_path, tiny_model_dir):
    """Global batch 4 > 2 actors + 1, max_staleness 0, collective weight push: every step completes on-policy."""
    from ziprl.actors.launch import launch

    out = tmp_path / "run"
    cfg = load_config(None, [
        f"run.out_dir={out}", f"run.sft_checkpoint={tiny_model_dir}", "model.device=cpu",
        "ray.num_rollout_actors=2", "learner.steps=3", "learner.global_batch_questions=4", "learner.beta=0",
        "rollout.batch_questions=1", "rollout.group_size=2", "env.max_turns=2", "sampling.max_new_tokens=16",
        "ray.max_staleness=0", "ray.learner_cpus=0.5", "ray.retriever_cpus=0.25", "learner.micro_batch_turns=8",
        "weights.transport=collective",
    ])
    ray.init(num_cpus=2, include_dashboard=False)
    launch(cfg, progress=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    for x in lines:
        assert x["rollout/trajectories"] == 8.0  # 4 questions x G = 2
        assert x["system/lag_0_groups"] == 4.0 and x["system/staleness"] == 0.0  # on-policy
        assert x["system/groups_generated"] == (x["system/groups_trained"] + x["system/groups_dropped_stale"]
                                                + x["system/groups_buffered"])
        assert 0.0 <= x["system/actor_idle_frac"] <= 1.0 and 0.0 <= x["system/learner_wait_frac"] <= 1.0
        assert x["system/rollout_rss_peak_mb"] > 0 and x["perf/weight_push_bytes"] > 0
    assert lines[-1]["system/groups_trained"] == 12.0 and lines[-1]["system/groups_dropped_stale"] == 0.0
    assert lines[-1]["system/groups_generated"] <= 12.0 + 4.0  # on-policy: at most one batch ahead
