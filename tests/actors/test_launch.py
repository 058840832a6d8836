"""Ray integration: launch on a local 2-CPU cluster, 2 rollout actors, 2 learner steps, one actor killed."""

from __future__ import annotations

import json
import signal
import threading
import time

import psutil
import pytest
import ray

from ziprl.actors.ray_utils import start_local_ray
from ziprl.config import ModelConfig, load_config

pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]


def _kill_rollout_actor_mid_batch(done: threading.Event, killed: list) -> None:
    """SIGKILL a rollout actor's process while it is executing ``run_batch`` (Ray titles it so): a crash."""
    while not done.is_set():  # no deadline: on a busy machine the actors may take minutes to load the model
        for proc in psutil.process_iter(["cmdline"]):
            if any("RolloutWorker.run_batch" in part for part in proc.info["cmdline"] or []):
                try:  # at once: an episode of the untrained model may end in under a second, and no job follows it
                    proc.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    continue
                killed.append(proc.pid)
                return
        time.sleep(0.1)


def test_launch_two_actors_two_steps_survives_actor_kill(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ziprl.actors.launch import launch
    from ziprl.policy import resolve_model_path

    out = tmp_path / "run"
    cfg = load_config(None, [
        f"run.out_dir={out}", f"run.sft_checkpoint={resolve_model_path(ModelConfig())}",
        "ray.num_rollout_actors=2", "learner.steps=2", "learner.global_batch_questions=1", "learner.beta=0",
        "rollout.batch_questions=1", "rollout.group_size=2", "env.max_turns=3", "sampling.max_new_tokens=40",
        "ray.max_staleness=2", "ray.learner_cpus=0.5", "ray.retriever_cpus=0.25", "run.keep_checkpoints=1",
    ])
    start_local_ray(num_cpus=2, include_dashboard=False)
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
    assert (out / "checkpoints").is_dir()
    assert len(list((out / "trajectories").glob("*.parquet"))) == 2


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
    start_local_ray(num_cpus=2, include_dashboard=False)
    launch(cfg, progress=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    for x in lines:
        assert x["rollout/trajectories"] == 8.0  # 4 questions x G = 2
        assert x["system/lag_0_groups"] == 4.0
        assert x["system/staleness"] == 0.0  # on-policy
        assert x["system/groups_generated"] == (x["system/groups_trained"] + x["system/groups_dropped_stale"]
                                                + x["system/groups_buffered"])
        assert 0.0 <= x["system/actor_idle_frac"] <= 1.0
        assert 0.0 <= x["system/learner_wait_frac"] <= 1.0
        assert x["system/rollout_rss_peak_mb"] > 0
        assert x["perf/weight_push_bytes"] > 0
    assert lines[-1]["system/groups_trained"] == 12.0
    assert lines[-1]["system/groups_dropped_stale"] == 0.0
    assert lines[-1]["system/groups_generated"] <= 12.0 + 4.0  # on-policy: at most one batch ahead


def test_launch_runs_stage1_beside_the_retriever_and_starts_the_actors_beside_the_learner(tmp_path, tiny_model_dir,
                                                                                          monkeypatch):
    """Stage 1 then one RL step on a local 2-CPU cluster, its set-up overlapped: the retriever deploys beside Stage 1,
    whose ranks ask for a Stage 2 rank's CPUs (leaving the retriever its own) and run on every core; the SFT ranks
    start building their trainer before the demos are done; Stage 2 trains on the same ranks (no new processes), in
    its own configuration and thread count, with Stage 1's bf16 decision, so the rollout actors start in the
    engines' dtype without waiting for the learner build."""
    from ziprl.actors import launch as launch_module
    from ziprl.actors.learner_actor import LearnerGroup

    events: list[tuple] = []
    starts: list[tuple] = []
    real_start = LearnerGroup.start

    def start(self, method, *args):
        starts.append((method, *args))
        return real_start(self, method, *args)

    monkeypatch.setattr(LearnerGroup, "start", start)

    def spy(name, record):
        real = getattr(launch_module, name)

        def wrapped(*args, **kwargs):
            events.append((f"{name} start", time.perf_counter(), *record(*args, **kwargs)))
            result = real(*args, **kwargs)
            events.append((f"{name} end", time.perf_counter()))
            return result

        monkeypatch.setattr(launch_module, name, wrapped)

    spy("LearnerGroup", lambda cfg, ranks, cpus, gpus, **kw: (cfg.learner.bf16, cpus, kw.get("threads")))
    spy("build_demos", lambda cfg: ())
    spy("deploy_retriever", lambda retriever_cfg, ray_cfg: (ray_cfg.retriever_cpus * ray_cfg.retriever_replicas,))
    spy("start_rollout_actors", lambda cfg, model, retriever: (cfg.model.dtype,))

    out = tmp_path / "run"
    cfg = load_config(None, [
        f"run.out_dir={out}", f"model.path={tiny_model_dir}", f"model.cache_dir={tmp_path / 'cache'}",
        "model.device=cpu", "demos.limit=2", "ray.num_rollout_actors=1", "learner.steps=1",
        "learner.global_batch_questions=1", "rollout.group_size=2", "env.max_turns=2", "sampling.max_new_tokens=16",
        "ray.learner_cpus=0.5", "ray.retriever_cpus=0.25",
    ])
    start_local_ray(num_cpus=2, include_dashboard=False)
    launch_module.launch(cfg, progress=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1]
    assert list((tmp_path / "cache" / "stage1").glob("*/model/config.json"))

    at = {e[0]: e for e in events}
    (group,) = [e for e in events if e[0] == "LearnerGroup start"]  # Stage 2 goes on with Stage 1's ranks
    _, started, bf16_1, cpus_1, threads_1 = group
    assert bf16_1 is None
    assert threads_1 == 2  # Stage 1 runs on both cores ...
    assert cpus_1 == 0.5
    assert cpus_1 + at["deploy_retriever start"][2] <= 2.0  # ... and leaves the retriever its CPUs
    assert started < at["build_demos end"][1]  # the SFT ranks started before the demos were done
    assert [s[0] for s in starts][:3] == ["build_sft_trainer", "sft", "build_trainer"]  # one group, both stages
    _, model, cfg2, threads_2 = starts[2]
    assert [model] == [str(p) for p in (tmp_path / "cache" / "stage1").glob("*/model")]
    assert threads_2 == 1
    assert cfg2["demos"]["out"] == cfg.demos.out  # Stage 2's configuration, not Stage 1's
    assert isinstance(cfg2["learner"]["bf16"], bool)  # Stage 1's decision
    assert at["start_rollout_actors start"][2] == ("bfloat16" if cfg2["learner"]["bf16"] else "float32")


def test_a_stage1_error_waits_for_the_overlapped_set_up_then_stops_ray(tmp_path, tiny_model_dir, monkeypatch):
    """Stage 1 overlaps the retriever's deploy and the SFT ranks' start. When the demos fail, the launch raises their
    error only once both are done and Ray is stopped: no thread of it is left to act on the stopped Ray (an earlier
    draft raised at once, and its SFT thread went on to start a new local Ray instance), nor Ray's signal handler."""
    from ziprl.actors import launch as launch_module

    done: list[str] = []
    real_group = launch_module.sft_group

    def slow_deploy(*args):
        time.sleep(3.0)
        done.append("deploy")

    def group(cfg):
        built = real_group(cfg)
        done.append("ranks")
        return built

    def broken_demos(cfg):
        raise ValueError("no demo episode kept")

    monkeypatch.setattr(launch_module, "deploy_retriever", slow_deploy)
    monkeypatch.setattr(launch_module, "sft_group", group)
    monkeypatch.setattr(launch_module, "build_demos", broken_demos)
    cfg = load_config(None, [
        f"run.out_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}", f"model.cache_dir={tmp_path / 'cache'}",
        "model.device=cpu", "ray.learner_cpus=0.5", "ray.retriever_cpus=0.25",
    ])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError, match="no demo episode kept"):
        launch_module.launch(cfg, progress=False)  # starting its own local Ray, as a library caller's launch does
    assert sorted(done) == ["deploy", "ranks"]
    assert not ray.is_initialized()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler Ray put in went with its cluster
    assert not [t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")]


def test_a_second_launch_waits_for_the_stage1_build_under_way_and_reuses_it(tmp_path, monkeypatch, lock_holder,
                                                                             waiting_for):
    """Two launches of one configuration: while another process builds its Stage 1 (holds the cache directory's
    lock), this one waits, then reuses that model; it starts no SFT ranks and makes no demos of its own."""
    from ziprl.actors import launch as launch_module
    from ziprl.learner.sft import stage1_dir

    def fail(*args):
        raise AssertionError("built Stage 1 a second time")

    monkeypatch.setattr(launch_module, "build_demos", fail)
    monkeypatch.setattr(launch_module, "sft_group", fail)
    cfg = load_config(None, [f"model.cache_dir={tmp_path / 'cache'}"])
    root, found = stage1_dir(cfg), []
    with lock_holder(root) as pid:
        waiter = threading.Thread(target=lambda: found.append(launch_module.run_stage1(cfg)))
        waiter.start()
        waiting_for(waiter, pid)
        assert waiter.is_alive()
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text("{}")
    waiter.join(60)
    assert found == [(root / "model", None, None)]


def test_a_launch_stopped_in_stage1_sft_continues_that_sft_from_its_checkpoint(tmp_path, monkeypatch):
    """A Stage-1 cache holding demos and an SFT checkpoint but no model (a launch stopped during SFT): the next launch
    makes no demos and has the ranks resume that SFT, in the dtype its checkpoint was written in."""
    from ziprl.actors import launch as launch_module
    from ziprl.learner.sft import stage1_dir

    calls: list[tuple] = []

    class Group:
        def call(self, method, *args):
            calls.append((method, *args))
            return str(root / "model")

        def shutdown(self):
            calls.append(("shutdown",))

    def group(cfg):
        calls.append(("ranks", cfg.learner.bf16))
        return Group(), True

    def fail(*args):
        raise AssertionError("made the demos again")

    monkeypatch.setattr(launch_module, "build_demos", fail)
    monkeypatch.setattr(launch_module, "sft_group", group)
    cfg = load_config(None, [f"model.cache_dir={tmp_path / 'cache'}", "model.device=cpu"])
    root = stage1_dir(cfg)
    (root / "checkpoints" / "step_3-ab").mkdir(parents=True)
    (root / "checkpoints" / "step_3-ab" / "state.json").write_text(json.dumps({"bf16": True}))
    (root / "checkpoints" / "latest").write_text("step_3-ab")
    (root / "demos.parquet").write_bytes(b"demos")
    model, _, _ = launch_module.run_stage1(cfg)
    assert model == root / "model"
    assert calls[0] == ("ranks", True)
    assert calls[1] == ("sft", str(root / "demos.parquet"), str(root), True)
