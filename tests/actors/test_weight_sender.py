"""RaySender on a local Ray cluster: a real learner rank (DeepSpeed, CPU) pushes to real rollout actors
(bf16 HFEngine) over both transports; bit-exact weights, versions, bytes, buckets, a crashed actor rejoining."""

from __future__ import annotations

import time

import pytest
import ray
import torch

from ziprl.actors.learner_actor import LearnerGroup
from ziprl.actors.ray_utils import start_local_ray, stop_ray
from ziprl.actors.rollout_actor import RolloutActor
from ziprl.actors.weight_sender import RaySender
from ziprl.config import ConfigError
from ziprl.env.group import to_arrow
from ziprl.testing.learner import make_cfg, make_groups, requires_deepspeed

pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster, requires_deepspeed]


def _cfg(transport: str, bucket_mb: float):
    cfg = make_cfg(lr=1e-2, micro_batch_turns=4, beta=0.0)
    cfg.model.dtype = "bfloat16"  # engines in bf16, learner float32 masters: 16-bit pushes
    cfg.weights.transport, cfg.weights.bucket_mb, cfg.weights.rendezvous_timeout_s = transport, bucket_mb, 60
    return cfg


def _learner_bits(learner) -> dict[str, torch.Tensor]:
    """The learner's parameters rounded to the engines' bf16, as raw int16 bits (tied ones once)."""
    fn = lambda w: {n: p.detach().bfloat16().view(torch.int16).clone()  # noqa: E731
                    for n, p in w.trainer.engine.module.named_parameters()}
    return ray.get(learner.actors[0].__ray_call__.remote(fn))


def _actor_bits(actor) -> tuple[int, dict[str, torch.Tensor]]:
    fn = lambda w: (w.engine.version, {n: p.detach().view(torch.int16).clone()  # noqa: E731
                                       for n, p in w.engine.model.named_parameters()})
    return ray.get(actor.__ray_call__.remote(fn))


def _assert_same(learner, actors, version: int) -> None:
    want = _learner_bits(learner)
    for a in actors:
        v, got = _actor_bits(a)
        assert v == version
        assert set(got) == set(want)
        for name in want:
            assert torch.equal(got[name], want[name]), name


@pytest.fixture(scope="module")
def stack(tiny_model_dir):
    """One learner rank and two bf16 rollout actors, shared by the tests (each builds its own RaySender)."""
    start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    table = to_arrow(make_groups(tiny_model_dir, groups=1, group_size=2, max_turns=1, logprob_noise=0.3))
    cfg = _cfg("object_store", 1.0)
    learner = LearnerGroup(cfg, ranks=1, cpus=0.5, gpus=0)
    learner.call("build_trainer", str(tiny_model_dir))
    actors = [RolloutActor.options(num_cpus=0.25).remote(cfg.to_dict(), str(tiny_model_dir), None, i, 1)
              for i in range(2)]
    state = {"version": 0}

    def step() -> int:
        """One learner step on a fixed batch (new weights); returns the next version to push."""
        learner.call("train_step", ray.put([table]))
        state["version"] += 1
        return state["version"]

    yield learner, actors, step
    learner.shutdown()
    stop_ray()


@pytest.mark.parametrize(("transport", "bucket_mb"), [("object_store", 0.05), ("collective", 64.0)])
def test_push_is_bit_exact_versioned_and_16_bit(stack, transport, bucket_mb):
    learner, actors, step = stack
    sync = RaySender(_cfg(transport, bucket_mb), learner, actors)
    try:
        v = step()
        stats = sync.push(v)
        _assert_same(learner, actors, v)
        n16 = sum(t.numel() * 2 for t in _learner_bits(learner).values())
        assert stats["bytes"] == n16
        assert stats["seconds"] > 0  # 16 bits per weight, tied embedding once

        before = _learner_bits(learner)
        step()  # new weights, pushed under an OLDER version tag: ignored
        sync.push(v - 1)
        for a in actors:
            got_v, got = _actor_bits(a)
            assert got_v == v
            assert all(torch.equal(got[k], before[k]) for k in before)
        sync.push(v + 1)
        _assert_same(learner, actors, v + 1)
    finally:
        sync.close()


def test_a_restarted_actor_rejoins_the_collective_group(stack):
    """Rejoin after a reported crash; and a push that meets an unreported crash forms the group again."""
    learner, actors, step = stack
    cfg = _cfg("collective", 0.5)  # several buckets
    cfg.weights.rendezvous_timeout_s = 15  # how long survivors wait in a broken broadcast
    sync = RaySender(cfg, learner, actors)
    try:
        v = step()
        sync.push(v)
        old_pid = ray.get(actors[0].pid.remote())
        ray.kill(actors[0], no_restart=False)  # a crash: Ray restarts it (max_restarts=-1) from the checkpoint
        deadline = time.monotonic() + 120
        while True:
            try:
                if ray.get(actors[0].pid.remote(), timeout=30) != old_pid:
                    break
            except ray.exceptions.RayActorError:
                pass
            assert time.monotonic() < deadline, "the killed actor was not restarted"
            time.sleep(0.5)
        assert _actor_bits(actors[0])[0] == 0  # a fresh process: the initial weights
        sync.rejoin(0, actors[0])  # new group, the latest version re-sent
        _assert_same(learner, actors, v)
        v = step()
        sync.push(v)  # and the next push reaches everyone
        _assert_same(learner, actors, v)

        ray.kill(actors[1], no_restart=False)  # a crash nobody reported: the push re-forms the group itself
        v = step()
        sync.push(v)
        _assert_same(learner, actors, v)
    finally:
        sync.close()


def test_weights_config_is_validated():
    cfg = make_cfg()
    cfg.weights.transport = "nccl"
    with pytest.raises(ConfigError, match="weights.transport must be 'object_store' or 'collective'"):
        cfg.validate()
    cfg = make_cfg()
    cfg.weights.bucket_mb = 0
    with pytest.raises(ConfigError, match="bucket_mb"):
        cfg.validate()
