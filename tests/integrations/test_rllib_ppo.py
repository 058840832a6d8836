"""RLlib PPO (new API stack) trains on the tokenized env over the shipped sample index, in a real local Ray cluster."""

from __future__ import annotations

import importlib.util
import math

import pytest

from tests.conftest import REPO

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]

ENV_CONFIG = {"max_len": 128, "num_candidates": 8, "env": {"max_turns": 4}}


def load_example():
    spec = importlib.util.spec_from_file_location("rllib_ppo_example", REPO / "examples" / "rllib_ppo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    from ray import tune

    from ziprl.actors.ray_utils import start_local_ray, stop_ray

    start_local_ray(num_cpus=2, include_dashboard=False)
    example = load_example()
    tune.register_env(example.ENV_NAME, example.make_tokenized_env)
    yield example
    stop_ray()


@pytest.mark.parametrize(("model", "num_env_runners"), [("bag", 1), ("mlp", 0)])
def test_ppo_trains_one_iteration(example, model, num_env_runners):
    algo = example.build_config(ENV_CONFIG, model, num_env_runners, train_batch=64, minibatch=32).build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners, learner = result["env_runners"], result["learners"]["default_policy"]
    assert runners["num_env_steps_sampled"] > 0
    assert runners["num_episodes"] > 0
    for key in ("total_loss", "policy_loss", "vf_loss", "entropy"):
        assert math.isfinite(float(learner[key])), (key, learner[key])
    assert learner["num_trainable_parameters"] > 0
