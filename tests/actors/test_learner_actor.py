"""The learner on Ray: two DeepSpeed ranks in two actors (ZeRO-3, gloo) take the step of one in-process rank."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import ray

from tests.conftest import requires_cpu_bf16
from ziprl.actors.driver import RefsFinished, check_resources
from ziprl.actors.learner_actor import LearnerGroup
from ziprl.actors.ray_utils import start_local_ray, stop_ray
from ziprl.config import ConfigError, load_config
from ziprl.env.group import to_arrow
from ziprl.learner.trainer import Trainer, warmup_factor
from ziprl.registry import TRANSPORTS
from ziprl.testing.learner import make_cfg, make_groups, requires_deepspeed
from ziprl.weights.buckets import unpack

pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster, requires_deepspeed]


@pytest.fixture(scope="module")
def cluster():
    start_local_ray(num_cpus=2, include_dashboard=False)
    yield
    stop_ray()


def test_two_ranks_on_ray_take_the_one_rank_step(cluster, tiny_model_dir, tmp_path):
    groups = make_groups(tiny_model_dir, groups=2, group_size=3, max_turns=2, logprob_noise=0.3)
    settings = {"micro_batch_turns": 2, "lr": 1e-3, "beta": 0.001}
    group = LearnerGroup(make_cfg(zero_stage=3, **settings), ranks=2, cpus=0.5, gpus=0)
    try:
        assert group.call("build_trainer", str(tiny_model_dir)) == "float32"  # model.dtype auto: the learner's
        stats = group.call("train_step", ray.put([to_arrow(groups)]))
        stored = group.call("announce_weights", TRANSPORTS["object_store"](256.0), group.call("version"))
        # ZeRO-3: both ranks gather (bucket by bucket), rank 0 puts
        published = {n: t.numpy() for b in ray.get(list(stored.buckets)) for n, t in unpack(b.metas, b.data).items()}
        ckpt = Path(group.call("save_checkpoint", str(tmp_path), {"index": 7}))
    finally:
        group.shutdown()

    single = Trainer(make_cfg(zero_stage=0, **settings), tiny_model_dir)
    ref = single.train_step(groups)
    for key in ("loss", "kl", "clip_frac", "tokens"):
        assert stats[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-9), key
    assert stats["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)  # ZeRO-3's norm sums partitions
    assert stored.version == 1
    assert stats["turns"] == ref["turns"]
    weights = single.named_weights_numpy()
    assert set(published) == set(weights)
    for name, value in weights.items():
        np.testing.assert_allclose(published[name], value, rtol=0, atol=2e-5, err_msg=name)  # Adam steps are ~lr=1e-3; gloo sum order moves near-zero grads
    assert ckpt.name.startswith("step_1-")
    assert (ckpt / "model.safetensors").is_file()
    assert (ckpt.parent / "latest").read_text().strip() == ckpt.name


def test_a_group_the_cluster_cannot_place_fails_before_any_work(cluster):
    with pytest.raises(ConfigError, match="cannot place 3 learner rank"):
        LearnerGroup(make_cfg(), ranks=3, cpus=1.0, gpus=0, timeout_s=2)


def test_asking_for_gpus_a_local_cluster_lacks_fails_before_any_work(cluster, capsys):
    cfg = load_config(None, ["ray.num_rollout_actors=4", "ray.rollout_gpus=0.5"])
    with pytest.raises(ConfigError, match=r"asks for 2 GPUs .* the cluster has 0"):
        check_resources(cfg)
    cfg.ray.address = "auto"  # a joined cluster may still scale up: only a warning
    check_resources(cfg)
    assert "until the autoscaler adds GPUs" in capsys.readouterr().err
    check_resources(load_config(None, []))  # the CPU defaults ask for none


def test_learner_and_retriever_cpus_a_local_cluster_lacks_fail_before_any_work(cluster):
    """The Stage 1 ranks (kept for Stage 2) and the retriever deploy at once: asking for the whole local cluster would
    leave one of them waiting for the other for ever (and the rollout actors nothing), so it is refused first."""
    for over in (["ray.learner_cpus=2"], ["ray.learner_cpus=1.5", "ray.retriever_cpus=0.5"]):
        with pytest.raises(ConfigError, match=r"ask for 2(.5)? CPUs .* this local cluster has 2, .* lower ray.learner_cpus"):
            check_resources(load_config(None, over))
    check_resources(load_config(None, ["ray.learner_cpus=1.5", "ray.retriever_cpus=0.25"]))
    joined = load_config(None, ["ray.learner_cpus=2"])
    joined.ray.address = "auto"  # a joined cluster may grow
    check_resources(joined)


@pytest.mark.parametrize(("bf16", "wire"), [pytest.param(True, "bfloat16", marks=requires_cpu_bf16),
                                           (False, "float32")])
def test_a_learner_rank_sends_its_compute_dtype_under_auto_engine_dtype(tiny_model_dir, bf16, wire):
    """model.dtype=auto: the rank reports the engines' dtype as its own compute dtype, and its pushes travel in it."""
    from ziprl.actors.learner_actor import LearnerWorker

    worker = LearnerWorker(make_cfg(bf16=bf16).to_dict())
    assert worker.cfg.model.dtype == "auto"
    assert worker.build_trainer(str(tiny_model_dir)) == wire
    assert {m.dtype for metas in worker.learner_weights().plan(1 << 28) for m in metas} == {wire}


def test_a_stage1_rank_goes_on_as_a_stage2_rank(tiny_model_dir):
    """On CPUs Stage 2 trains on Stage 1's ranks: ``build_trainer`` frees the SFT trainer before it loads, and takes
    Stage 2's configuration and thread count."""
    import weakref

    import torch

    from ziprl.actors.learner_actor import LearnerWorker

    base = torch.get_num_threads()
    try:
        stage1 = make_cfg()
        stage1.model.path = str(tiny_model_dir)
        worker = LearnerWorker(stage1.to_dict(), 2)
        assert torch.get_num_threads() == 2
        assert worker.build_sft_trainer() is False
        sft = weakref.ref(worker.trainer)
        assert sft().reference is None  # SFT has no KL term
        stage2 = make_cfg(beta=0.1, lr=3e-4)
        assert worker.build_trainer(str(tiny_model_dir), stage2.to_dict(), 1) == "float32"
        assert sft() is None
        assert torch.get_num_threads() == 1
        assert worker.cfg.learner == stage2.learner
        assert worker.trainer.reference is not None
        assert worker.trainer.lr == pytest.approx(3e-4 * warmup_factor(stage2.learner.warmup_steps)(0))  # Stage 2's
    finally:
        torch.set_num_threads(base)


def test_a_background_checkpoint_is_written_beside_the_next_step_and_waited_for(tiny_model_dir, tmp_path,
                                                                                monkeypatch):
    """``save_checkpoint(background=True)`` with ``run.background_checkpoints`` on (by default only on a GPU learner)
    copies the trainer and returns; the write runs in a thread while the next step trains. The checkpoint holds the
    weights of when it was taken, the next save or load waits for it, and a write that failed raises there."""
    import threading

    from ziprl.actors.learner_actor import LearnerWorker
    from ziprl.learner import checkpoint

    cfg = make_cfg(lr=1e-2, beta=0.0)
    worker = LearnerWorker(cfg.to_dict())
    worker.build_trainer(str(tiny_model_dir))
    groups = make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=2, logprob_noise=0.3)
    at_once = Path(worker.save_checkpoint(str(tmp_path / "cpu"), {"index": 0}, background=True))
    assert at_once.is_dir()
    assert worker._writing is None  # by default a CPU learner writes at once
    cfg.run.background_checkpoints = True
    worker.build_trainer(str(tiny_model_dir), cfg.to_dict())
    worker.train_step([to_arrow(groups)])
    taken = worker.trainer.named_weights_numpy()

    release, real_write = threading.Event(), checkpoint.write_snapshot
    monkeypatch.setattr(checkpoint, "write_snapshot", lambda snap: (release.wait(30), real_write(snap))[1])
    first = Path(worker.save_checkpoint(str(tmp_path), {"index": 1}, background=True))
    assert not first.exists()
    assert worker._writing is not None  # still writing (held back) ...
    worker.train_step([to_arrow(groups)])  # ... while the next step trains
    release.set()
    assert worker.load_latest(str(tmp_path)) == {"index": 1}  # the load waited for the write
    assert (first.parent / "latest").read_text().strip() == first.name
    loaded = worker.trainer.named_weights_numpy()
    assert all(np.array_equal(loaded[k], taken[k]) for k in taken)  # the weights of when it was taken

    monkeypatch.setattr(checkpoint, "write_snapshot", lambda snap: (_ for _ in ()).throw(OSError("disk full")))
    worker.save_checkpoint(str(tmp_path), {"index": 2}, background=True)
    with pytest.raises(OSError, match="disk full"):
        worker.save_checkpoint(str(tmp_path), {"index": 3})
    assert worker._writing is None
    assert (first.parent / "latest").read_text().strip() == first.name


def test_a_step_takes_the_idle_cores_once_the_rollouts_finish_then_gives_them_back(cluster, tiny_model_dir):
    """The launch's learner rank keeps one thread while rollout actors share its cores; once no rollout runs (checked
    before every forward and every backward), the rest of its step runs on the local cluster's idle cores, which it gives
    back afterwards."""
    import torch

    from ziprl.actors.driver import RayLearner
    from ziprl.actors.learner_actor import LearnerWorker

    groups = make_groups(tiny_model_dir, groups=2, group_size=2, max_turns=2, logprob_noise=0.3)
    table = to_arrow(groups)
    before = torch.get_num_threads()
    try:
        worker = LearnerWorker(make_cfg(micro_batch_turns=1).to_dict(), num_threads=1)
        worker.build_trainer(str(tiny_model_dir))
        polled = []

        def rollouts_idle():  # the last rollout finishes during the second pass's forward
            polled.append(torch.get_num_threads())
            return len(polled) == 4

        stats = worker.train_step([table], idle=(2, rollouts_idle))
        phases = 1 + 2 * stats["passes"]  # the step's shared-prefix forward, then a forward and a backward each
        assert phases >= 9
        assert polled == [1, 1, 1, 1]  # polled on one thread until it turned true, then never again
        assert stats["cpu_threads"] == 2.0
        assert stats["idle_core_phases"] == phases - 3  # from that forward on
        assert torch.get_num_threads() == 1  # given back
        assert worker.train_step([table], idle=(2, lambda: True))["idle_core_phases"] == phases
        busy = worker.train_step([table], idle=(2, lambda: False))
        assert busy["cpu_threads"] == 1.0
        assert busy["idle_core_phases"] == 0.0
        assert worker.train_step([table])["cpu_threads"] == 1.0
    finally:
        torch.set_num_threads(before)

    class Group:  # the ranks' calls, recorded
        def __init__(self):
            self.calls = []

        def call(self, method, *args):
            self.calls.append((method, args[1:]))
            return 0 if method == "version" else {"policy_version": len(self.calls)}

    probe = RefsFinished([])
    for idle_threads, sent in ((2, (2, probe)), (None, None)):
        group = Group()
        RayLearner(group, idle_threads=idle_threads).train_step(groups, rollouts_idle=probe)
        assert [args for method, args in group.calls if method == "train_step"] == [(sent,)]


def test_the_rollouts_idle_probe_turns_true_once_the_calls_in_flight_finish_seen_from_another_process(cluster):
    """RaySource's probe holds the rollout calls in flight when the step began; a learner rank polls it remotely."""

    @ray.remote(num_cpus=0)
    class Gate:
        def __init__(self):
            self.open = False

        def release(self):
            self.open = True

        def is_open(self):
            return self.open

    @ray.remote(num_cpus=0)
    def rollout(gate):  # runs until the gate opens
        while not ray.get(gate.is_open.remote()):
            time.sleep(0.02)

    @ray.remote(num_cpus=0)
    def poll(probe):
        return probe()

    assert RefsFinished([])()
    gate, done = Gate.remote(), Gate.remote()
    ray.get(done.release.remote())
    finished, running = rollout.remote(done), rollout.remote(gate)
    ray.get(finished)
    probe = RefsFinished([finished, running])
    assert not probe()
    assert not ray.get(poll.remote(probe))
    ray.get(gate.release.remote())
    ray.get(running)
    assert probe()
    assert ray.get(poll.remote(probe))
